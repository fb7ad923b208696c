"""A worker's held requests: their frozen machine, and waiting for room."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from automaton import exceptions as automaton_exc

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.worker_side import held

#: Bounded wait (s) used only to fail instead of hanging.
WAIT_S = 10.0

KEY = ("u-1", pr.EXECUTE, "sub-1")
#: Encoded size of the outcomes these tests finish with (what a worker sent).
OUTCOME_BYTES = 20


def _held(memory: held.RequestMemory, key: held.Key = KEY) -> held.Held:
    verdict = memory.admit(key, "reply", 0, announced=True)
    assert verdict.kind == held.NEW and verdict.held is not None
    return verdict.held


def test_the_machine_is_frozen_and_says_every_move():
    assert set(held.TRANSITIONS.items()) == {
        ((held.QUEUED, "on_running"), held.RUNNING),
        ((held.RUNNING, "on_answered"), held.ANSWERED),
        ((held.QUEUED, "on_answered"), held.ANSWERED),
    }
    # QUEUED is what a heartbeat of a queued request says on the wire
    assert held.QUEUED == pr.PENDING
    with pytest.raises(automaton_exc.FrozenMachine):
        held.MACHINE.add_state("LOST")


def test_a_request_runs_then_is_answered_once():
    memory = held.RequestMemory()
    entry = _held(memory)
    assert entry.state == held.QUEUED
    assert memory.start(KEY) is entry and entry.state == held.RUNNING
    assert memory.answer(entry, {"state": pr.SUCCESS}) is True
    # Answered again (its outcome became a FAILURE on the way): no move, new body kept
    assert memory.answer(entry, {"state": pr.FAILURE}) is False
    assert (entry.state, entry.outcome) == (held.ANSWERED, {"state": pr.FAILURE})


def test_a_move_the_machine_does_not_allow_is_refused_naming_it():
    memory = held.RequestMemory()
    entry = _held(memory)
    memory.start(KEY)
    with pytest.raises(exc.InvalidState, match="from RUNNING to PENDING"):
        entry.transition(held.QUEUED)
    memory.answer(entry)
    with pytest.raises(exc.InvalidState, match="from ANSWERED to RUNNING"):
        entry.transition(held.RUNNING)


def test_a_request_given_back_before_it_started_is_never_started(caplog):
    # Given a queued request a cold shutdown answered (gave back)
    memory = held.RequestMemory()
    entry = _held(memory)
    assert memory.answer(entry) is True
    # When a thread would start it, then it is not started (and it says so)
    with caplog.at_level(logging.INFO):
        assert memory.start(KEY) is None
    assert entry.state == held.ANSWERED
    assert "given back before a thread could start it" in caplog.text


def test_waiting_for_room_ends_when_a_request_stops_being_held():
    # Given two requests held and a thread waiting until at most one is
    memory = held.RequestMemory()
    _held(memory)
    _held(memory, ("u-2", pr.EXECUTE, "sub-1"))
    never = threading.Event()
    waiting = threading.Thread(target=memory.wait_until_at_most, args=(1, never))
    waiting.start()
    # When one finishes, then the wait ends
    memory.finish(KEY, {"state": pr.SUCCESS}, OUTCOME_BYTES)
    waiting.join(WAIT_S)
    assert not waiting.is_alive()


def test_waiting_for_room_ends_when_given_up():
    memory = held.RequestMemory()
    _held(memory)
    give_up = threading.Event()
    waiting = threading.Thread(target=memory.wait_until_at_most, args=(0, give_up))
    waiting.start()
    give_up.set()
    memory.wake_waiters()
    waiting.join(WAIT_S)
    assert not waiting.is_alive() and len(memory) == 1


def test_waiting_until_none_held_ends_when_the_last_of_those_is_finished():
    # Given two requests to wait for and an unrelated one, all held
    memory = held.RequestMemory()
    second = ("u-2", pr.EXECUTE, "sub-1")
    for key in (KEY, second, ("u-3", pr.EXECUTE, "sub-1")):
        _held(memory, key)
    keys = {KEY[:2], second[:2]}
    # When one of the two finishes, the other is still held
    memory.finish(KEY, {"state": pr.SUCCESS}, OUTCOME_BYTES)
    assert memory.wait_until_none_held(keys, deadline=time.monotonic()) is False
    # and a thread waiting for both wakes once the second one goes too
    result: list[bool] = []
    waiting = threading.Thread(
        target=lambda: result.append(
            memory.wait_until_none_held(keys, deadline=time.monotonic() + WAIT_S)
        )
    )
    waiting.start()
    memory.forget(second)
    waiting.join(WAIT_S)
    assert not waiting.is_alive() and result == [True]
    assert len(memory) == 1  # the unrelated request is not waited for


def test_waiting_until_none_held_gives_up_at_its_deadline():
    memory = held.RequestMemory()
    _held(memory)
    assert memory.wait_until_none_held({KEY[:2]}, deadline=time.monotonic() - 1) is False
    assert memory.wait_until_none_held(set(), deadline=time.monotonic() - 1) is True
