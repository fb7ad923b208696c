"""Child process of the persistence tests: runs or resumes a flow, then exits.

    child.py start  URL EFFECTS [ENGINE]      new flow from flows.make_flow
    child.py resume URL FLOW_UUID [ENGINE]    resume a saved flow detail
    child.py chain  URL EFFECTS PREFIX N      run flows.make_chain (concurrency)

Prints ``FLOW <uuid>`` once the flow detail is saved and ``STATE <state>``
at the end (plus what the tasks print, e.g. ``BLOCKED b``).
"""

from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from flowengine import engines  # noqa: E402
from flowengine.persistence import backends, models  # noqa: E402
from tests.persistence import flows  # noqa: E402


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    mode, url = argv[0], argv[1]
    with backends.backend(url) as backend:
        if mode == "start":
            engine_kind = argv[3] if len(argv) > 3 else "serial"
            book = models.LogBook("crash-test")
            engine = engines.load_from_factory(flows.make_flow, factory_args=[argv[2]],
                                               backend=backend, book=book, engine=engine_kind)
        elif mode == "resume":
            engine_kind = argv[3] if len(argv) > 3 else "serial"
            with contextlib.closing(backend.get_connection()) as conn:
                flow_detail = conn.get_flow_details(argv[2])
            engine = engines.load_from_detail(flow_detail, backend=backend, engine=engine_kind)
        else:
            book = models.LogBook(f"chain-{argv[3]}")
            flow = flows.make_chain(argv[2], argv[3], int(argv[4]))
            engine = engines.load(flow, backend=backend, book=book)
        _say(f"FLOW {engine.storage.flow_uuid}")
        engine.run()
        _say(f"STATE {engine.storage.get_flow_state()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
