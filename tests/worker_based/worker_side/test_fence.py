"""The fence (worker_side/fence.py) and the keepalive of a consume loop waiting for room."""

from __future__ import annotations

import types

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.messaging.keepalive import Keepalive
from flowengine.engines.worker_based.worker_side import held
from flowengine.engines.worker_based.worker_side.fence import FENCE_AT_FRACTION, Fence

INTERVAL_S = 0.2


class _Runner:
    """Records which bodies the fence asked to stop."""

    def __init__(self) -> None:
        self.interrupted: list[tuple[str, str]] = []

    def interrupt(self, key: tuple[str, str]) -> bool:
        self.interrupted.append(key)
        return True


def _held(
    memory: held.RequestMemory, name: str, announced: bool = True, misses: int | None = 5
) -> held.Held:
    verdict = memory.admit(
        (name, pr.EXECUTE, "sub"), "reply", 0, announced=announced, loss_bound=(misses, None)
    )
    assert verdict.held is not None
    return verdict.held


def test_unconfirmed_requests_are_stopped_before_the_engines_bound():
    # Given a running and a queued request, last confirmed at t=100, whose
    # engine allows 5 misses of 0.2 s (a 1 s bound)
    memory, runner = held.RequestMemory(), _Runner()
    fence = Fence(memory, runner, INTERVAL_S, "w1")  # type: ignore[arg-type]
    running, queued = _held(memory, "run"), _held(memory, "queue")
    memory.start(running.key)
    for entry in (running, queued):
        entry.confirmed_at = 100.0
    # When less than the fence's share of the bound has passed, nothing happens
    assert fence.check(100.0 + FENCE_AT_FRACTION - 0.01) == []
    # When more has, both are fenced: the running body is stopped, the queued
    # one will not start
    assert {h.key for h in fence.check(100.0 + FENCE_AT_FRACTION + 0.01)} == {
        running.key,
        queued.key,
    }
    assert runner.interrupted == [running.key[:2]]
    assert memory.start(queued.key) is None
    assert memory.is_fenced(running.key)
    # ...once: the next check neither fences nor interrupts again
    assert fence.check(200.0) == [] and runner.interrupted == [running.key[:2]]


def test_taskflow_requests_and_a_failing_broker_are_left_alone():
    memory, runner = held.RequestMemory(), _Runner()
    failing = [True]
    fence = Fence(
        memory,
        runner,
        INTERVAL_S,
        "w1",  # type: ignore[arg-type]
        broker_failing=lambda: failing[0],
    )
    taskflow = _held(memory, "tf", announced=False)
    ours = _held(memory, "ours")
    taskflow.confirmed_at = ours.confirmed_at = 100.0
    # While the broker answers with errors (down for everyone), nothing is stopped
    assert fence.check(150.0) == []
    # Once it works again, the clocks restart then
    failing[0] = False
    assert fence.check(150.0) == []
    assert ours.confirmed_at == 150.0
    # A TaskFlow engine's request (no loss detection there) is never fenced
    assert fence.check(300.0) == [ours]


def test_keepalive_sends_a_frame_every_half_interval():
    sent: list[int] = []
    raw = types.SimpleNamespace(heartbeat=2.0, send_heartbeat=lambda: sent.append(1))
    conn = types.SimpleNamespace(supports_heartbeats=True, connection=raw)
    keepalive = Keepalive(conn)  # type: ignore[arg-type]
    assert keepalive.period_s == 1.0
    keepalive._last -= 1.0  # one period ago
    keepalive.beat()
    keepalive.beat()  # not due again yet
    assert sent == [1]
    # No heartbeats negotiated (or none supported): nothing to send
    silent = Keepalive(types.SimpleNamespace(supports_heartbeats=False))  # type: ignore[arg-type]
    assert silent.period_s is None
    silent.beat()
