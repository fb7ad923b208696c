"""Jobs and a conductor process for the tests of boards shared with TaskFlow.

``ledger_flow`` is the flow every job runs: one task that appends
``<tag> <library> <pid>`` to the ledger file named in the job's store, so
a test can count each job's runs and see who ran it. Its task derives from
the ``Task`` of the library chosen by ``FLOWENGINE_INTEROP_LIBRARY`` (the
conductor's), as a migrated program's tasks would.

``python -m tests.interop.compat_jobs LIBRARY BOARD_CONF PERSISTENCE COUNT
TIMEOUT_S`` runs that library's blocking conductor on the board (a JSON
conf) until it consumed COUNT jobs, then prints ``consumed N in S s``
and exits 0 (1 if TIMEOUT_S passed first).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

LIBRARY_ENV = "FLOWENGINE_INTEROP_LIBRARY"
LIBRARY = os.environ.get(LIBRARY_ENV, "flowengine")
#: Set to "1" in a conductor's environment: its runs record themselves as
#: ``hung`` and then hang (HANG_S), as on a host that dies mid-job.
HANG_ENV = "FLOWENGINE_COMPAT_TEST_HANG"
HANG_S = 120.0


def _module(library: str, name: str) -> Any:
    return importlib.import_module(f"{library}.{name}")


def _append(ledger: str, line: str) -> None:
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write of a short line: O_APPEND keeps it whole
    finally:
        os.close(fd)


def ledger_flow() -> Any:
    """A one-task flow recording each run in the ledger (the conductor's library)."""
    task = _module(LIBRARY, "task")
    linear_flow = _module(LIBRARY, "patterns.linear_flow")

    class RecordRun(task.Task):
        def execute(self, ledger: str, tag: str) -> str:
            hang = os.environ.get(HANG_ENV) == "1"
            _append(ledger, f"{tag} {LIBRARY} {os.getpid()}{' hung' if hang else ''}\n")
            if hang:  # a host that stops mid-job: the test kills this process now
                time.sleep(HANG_S)
            return tag

    return linear_flow.Flow("ledger").add(RecordRun("record-run"))


def persistence(library: str, url: str) -> Any:
    """``library``'s persistence backend on ``url``, its schema upgraded."""
    backend = _module(library, "persistence.backends").fetch({"connection": url})
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    return backend


def save_book(
    library: str, backend: Any, tag: str, ledger: str, uuids: tuple[str, str] | None = None
) -> Any:
    """A logbook with one flow detail of ``ledger_flow``, saved with ``library``.

    ``uuids``: the (logbook, flow detail) uuids, to save the same book twice.
    """
    models = _module(library, "persistence.models")
    engines = _module(library, "engines")
    book_uuid, flow_uuid = uuids or (str(uuid.uuid4()), str(uuid.uuid4()))
    book = models.LogBook(f"book-{tag}", uuid=book_uuid)
    detail = models.FlowDetail(f"flow-{tag}", uuid=flow_uuid)
    book.add(detail)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.save_logbook(book)
    engines.save_factory_details(detail, ledger_flow, [], {}, backend=backend)
    return book


def run_conductor(
    library: str, board_conf: dict[str, Any], persistence_url: str, count: int, timeout_s: float
) -> int:
    """Conduct until ``count`` jobs were consumed; 0, or 1 after ``timeout_s``."""
    backend = persistence(library, persistence_url)
    board = _module(library, "jobs.backends").fetch("compat-test", board_conf, persistence=backend)
    board.connect()
    conductor = _module(library, "conductors.backends").fetch(
        "blocking",
        f"{library}-conductor-{os.getpid()}",
        board,
        persistence=backend,
        engine="serial",
    )
    consumed = []
    done = threading.Event()

    def on_consumed(_state: str, details: dict[str, Any]) -> None:
        consumed.append(details["job"].uuid)
        if len(consumed) >= count:
            done.set()

    conductor.notifier.register("job_consumed", on_consumed)
    started = time.monotonic()
    runner = threading.Thread(target=conductor.run, daemon=True)
    runner.start()
    finished = done.wait(timeout_s)
    took = time.monotonic() - started
    conductor.stop()
    runner.join(timeout_s)
    board.close()
    print(f"consumed {len(consumed)} in {took:.2f} s", flush=True)
    return 0 if finished else 1


if __name__ == "__main__":
    lib, conf, url, n, limit = sys.argv[1:6]
    sys.exit(run_conductor(lib, json.loads(conf), url, int(n), float(limit)))
