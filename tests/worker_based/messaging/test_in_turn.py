"""InTurn: a handler called while another runs waits for it, in order."""

from __future__ import annotations

import pytest

from flowengine.engines.worker_based.messaging.in_turn import InTurn


def test_a_call_made_inside_a_handler_runs_after_it_in_order():
    in_turn = InTurn()
    log: list[str] = []

    def handle(name: str, arrivals: tuple[str, ...] = ()) -> None:
        log.append(f"start {name}")
        for arrival in arrivals:  # as py-amqp delivers during a handler's wait
            in_turn.run(handle, arrival)
        log.append(f"end {name}")

    in_turn.run(handle, "a", ("b", "c"))
    assert log == ["start a", "end a", "start b", "end b", "start c", "end c"]
    assert in_turn.deferred_count == 2


def test_calls_waiting_behind_a_handler_that_raised_are_dropped():
    in_turn = InTurn()
    ran: list[str] = []

    def broken(arrival: str) -> None:
        in_turn.run(ran.append, arrival)
        raise ConnectionResetError("the connection broke")

    with pytest.raises(ConnectionResetError):
        in_turn.run(broken, "came on the broken connection")
    # What waited came on the connection the loop now replaces: dropped,
    # and the next call runs at once.
    in_turn.run(ran.append, "after the reconnection")
    assert ran == ["after the reconnection"]
