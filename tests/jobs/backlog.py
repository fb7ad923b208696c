"""A blocking conductor working off a backlog of one-task jobs, its board's requests counted."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from tests import waiting
from tests.jobs.boards import Boards


def work_off_a_backlog(
    boards: Boards, backlog: int, counting: Callable[[Any], AbstractContextManager[Any]]
) -> tuple[Any, Any]:
    """Post ``backlog`` jobs from one board and run them off with a conductor on another.

    ``counting(board)`` counts the conductor's board's requests while the
    conductor works (a lease long enough that no renewal falls in the run).
    Returns the counter and the poster's board.
    """
    from flowengine import engines
    from flowengine.conductors import backends as conductors
    from flowengine.persistence.backends import impl_memory
    from flowengine.utils import persistence_utils as pu
    from tests.conductors import flows

    persistence = impl_memory.MemoryBackend()
    poster = boards.make("poster")
    for _ in range(backlog):
        lb, fd = pu.temporary_flow_detail(persistence)
        engines.save_factory_details(fd, flows.ok_factory, [], {}, backend=persistence)
        poster.post("job", lb, details={"flow_uuid": fd.uuid})
    board = boards.make("conductor", persistence=persistence, lease_s=60)
    conductor = conductors.fetch("blocking", "c1", board, persistence=persistence)
    consumed = threading.Semaphore(0)
    conductor.notifier.register("job_consumed", lambda *_a, **_k: consumed.release())
    with counting(board) as sent:
        runner = threading.Thread(target=conductor.run, daemon=True)
        runner.start()
        try:
            for _ in range(backlog):
                assert consumed.acquire(timeout=waiting.WAIT_S), "a job was not consumed"
        finally:
            conductor.stop()
            assert conductor.wait(waiting.WAIT_S)
    return sent, poster
