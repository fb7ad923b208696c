"""RemoteStatistics: queue and run time of remote atoms, with and without a RUNNING reply."""

from __future__ import annotations

import pytest

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import tracking as tr
from flowengine.engines.worker_based.executor_side.remote_stats import RemoteStatistics
from tests.worker_based import executor_tasks as et


def _tracked(created_ago_s: float, running_ago_s: float | None) -> tr.Tracked:
    """A request dispatched ``created_ago_s`` ago, said RUNNING ``running_ago_s`` ago."""
    request = pr.Request(et.Echo("e"), "u-1", pr.EXECUTE, {"value": 1}, timeout=60)
    request.created_on -= created_ago_s
    request.transition(pr.PENDING)
    if running_ago_s is not None:
        request.transition(pr.RUNNING)
        # Leaving PENDING stopped its clock: move that moment back as well.
        request._stopped_at -= running_ago_s  # type: ignore[operator]
    return tr.Tracked(request, None, None, tr.Owner(RemoteStatistics()))


def test_run_time_counts_from_the_running_reply():
    stats = RemoteStatistics()
    stats.record(_tracked(created_ago_s=3.0, running_ago_s=1.0))
    atom = stats.snapshot()["e"]
    assert atom["queue_time"] == pytest.approx(2.0, abs=0.05)
    assert atom["run_time"] == pytest.approx(1.0, abs=0.05)


def test_without_a_running_reply_the_worker_says_how_long_the_body_ran():
    # A flowengine worker tells RUNNING only about requests that run a while:
    # the outcome came first, with the body's run time.
    stats = RemoteStatistics()
    stats.record(_tracked(created_ago_s=3.0, running_ago_s=None), run_s=0.5)
    atom = stats.snapshot()["e"]
    assert atom["run_time"] == pytest.approx(0.5, abs=0.05)
    assert atom["queue_time"] == pytest.approx(2.5, abs=0.05)


def test_an_engines_run_time_is_the_bodys_not_the_time_since_a_late_running_reply():
    # A flowengine worker says RUNNING only 50 ms into a body: timing from that
    # reply printed a 0.3 s body as 0.25 s run and 50 ms more queue.
    from flowengine import engines
    from flowengine.patterns import linear_flow as lf
    from tests.worker_based.executor_helpers import MEMORY, running_worker, unique

    exchange = unique()
    with running_worker(exchange, "t", [et.Sleeps]):
        flow = lf.Flow("timed").add(et.Sleeps("nap"))
        engine = engines.load(
            flow,
            engine="worker-based",
            exchange=exchange,
            topics=["t"],
            store={"seconds": 0.3},
            **MEMORY,
        )
        engine.run()
    atom = engine.statistics["atoms"]["nap"]
    assert atom["run_time"] >= 0.3  # the body slept that long, whatever the load
