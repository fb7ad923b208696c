"""The pieces behind inspect/control, alone: messages, activity, priority, handler chain."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flowengine import exceptions as exc
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import control as wc
from flowengine.engines.worker_based.wire.headers import Headers
from flowengine.engines.worker_based.worker_side import activity as act
from flowengine.engines.worker_based.worker_side import exception_handlers as eh
from flowengine.engines.worker_based.worker_side import held, priority
from flowengine.engines.worker_based.worker_side.middleware import Job
from flowengine.types import failure as ft

#: Bounded wait (s) in these tests: only so that a bug fails instead of hanging.
WAIT_S = 10.0


# --- messages ---


def test_a_control_request_round_trips_and_says_whom_it_concerns():
    request = wc.ControlRequest(wc.CANCEL, {"request": "r-1"}, ("w-1",))
    again = wc.ControlRequest.from_dict(request.to_dict())
    assert again == request
    assert again.concerns("w-1") and not again.concerns("w-2")
    assert wc.ControlRequest(wc.PING).concerns("anyone")


@pytest.mark.parametrize(
    "body, problem",
    [
        ({"command": "reboot"}, "is not one of"),
        ({"command": "cancel", "arguments": {}}, "'request' is a required property"),
        ({"command": "cancel", "arguments": {"request": "r", "force": True}}, "force"),
        ({"command": "ping", "arguments": {"x": 1}}, "Arguments of control command 'ping'"),
        ({"command": "ping", "extra": 1}, "Additional properties"),
        ({"command": "ping", "destination": "w-1"}, "destination"),
    ],
)
def test_a_bad_control_request_is_refused_naming_the_problem(body, problem):
    with pytest.raises(exc.InvalidFormat) as info:
        wc.ControlRequest.validate(body)
    assert problem in str(info.value)


def test_a_control_reply_round_trips_and_is_validated():
    reply = wc.ControlReply("w-1", wc.PING, True, {"worker": {"pid": 1}})
    assert wc.ControlReply.from_dict(reply.to_dict()) == reply
    with pytest.raises(exc.InvalidFormat):
        wc.ControlReply.validate({"worker_id": "w-1", "command": "ping"})


# --- activity and cancellation ---


def _job(uuid: str = "r-1", action: str = pr.EXECUTE, name: str = "t") -> Job:
    work = pr.WorkUnit(task_cls="m.T", task_name=name, action=action, arguments={})
    return Job(
        endpoint=None,
        task=None,
        work=work,
        key=(uuid, action, "s-1"),  # type: ignore[arg-type]
        headers=Headers.parse({}),
        topic="topic",
    )


def test_cancelling_a_queued_request_refuses_it_when_a_thread_would_start_it():
    activity = act.Activity()
    job = _job()
    activity.after_receive(job)
    assert activity.snapshot()[0]["state"] == act.QUEUED
    found = activity.cancel("r-1")
    assert found == {
        "request": "r-1",
        "held": True,
        "states": [act.QUEUED],
        "process_killed": False,
    }
    refusal = activity.refuse_start(job)
    assert isinstance(refusal, exc.RequestCancelled)
    assert "before it started" in str(refusal)
    assert activity.totals.cancelled == 1


def test_cancelling_a_running_request_sets_its_flag_and_kills_its_child_if_any():
    killed: list[int] = []
    activity = act.Activity(kill_child=lambda thread_id: killed.append(thread_id) or True)
    job = _job()
    activity.after_receive(job)
    activity.before_execute(job)
    flag = job.cancelled
    found = activity.cancel("r-1")
    assert flag.is_set() and found["process_killed"] is True
    assert killed == [threading.get_ident()]
    activity.after_execute(job, ft.Failure.from_exception(exc.RequestCancelled("x")), 0.5)
    activity.after_release(job)
    assert activity.totals.cancelled == 1 and activity.totals.failed == 0
    assert activity.snapshot() == []


def test_a_request_not_held_is_dropped_if_its_execute_arrives_later_but_its_revert_runs():
    activity = act.Activity()
    assert activity.cancel("r-2")["held"] is False
    revert = _job("r-2", pr.REVERT)
    activity.after_receive(revert)
    assert activity.refuse_start(revert) is None
    execute = _job("r-2", pr.EXECUTE)
    activity.after_receive(execute)
    assert isinstance(activity.refuse_start(execute), exc.RequestCancelled)
    # remembered once: a later redelivery of it is not refused again
    assert activity.refuse_start(execute) is None


def test_cancellations_are_forgotten_after_their_keep_period():
    activity = act.Activity(keep_s=0.0)
    activity.cancel("r-3")
    job = _job("r-3")
    activity.after_receive(job)
    assert activity.refuse_start(job) is None


# --- several topics ---


def test_the_room_gives_the_freed_place_to_the_highest_waiting_topic():
    room = priority.PriorityRoom(capacity=1, ranks=2)
    high, low = room.memory(), room.memory()
    never = threading.Event()
    assert room.admit(0, high, never, ("busy", "execute", None), "r", 0, None, True)
    order: list[str] = []

    def take(rank: int, memory: held.RequestMemory, key: str) -> None:
        verdict = room.admit(rank, memory, never, (key, "execute", None), "r", 0, None, True)
        assert verdict is not None and verdict.kind == held.NEW
        order.append(key)

    low_thread = threading.Thread(target=take, args=(1, low, "low"))
    low_thread.start()
    with room.condition:
        assert room.condition.wait_for(lambda: tuple(room.waiting) == (0, 1), WAIT_S)
    high_thread = threading.Thread(target=take, args=(0, high, "high"))
    high_thread.start()
    with room.condition:
        assert room.condition.wait_for(lambda: tuple(room.waiting) == (1, 1), WAIT_S)
    high.forget(("busy", "execute", None))  # a place frees
    high_thread.join(WAIT_S)
    assert order == ["high"] and room.held == 1
    high.forget(("high", "execute", None))
    low_thread.join(WAIT_S)
    assert order == ["high", "low"]


def test_a_loop_waiting_for_its_turn_gives_up_when_the_worker_stops():
    room = priority.PriorityRoom(capacity=1, ranks=1)
    memory = room.memory()
    memory.admit(("busy", "execute", None), "r", 0)
    stop = threading.Event()
    result: list[Any] = []
    waiter = threading.Thread(
        target=lambda: result.append(
            room.admit(0, memory, stop, ("k", "execute", None), "r", 0, None, True)
        )
    )
    waiter.start()
    stop.set()
    memory.wake_waiters()
    waiter.join(WAIT_S)
    assert result == [None]


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_a_full_room_is_waited_for_in_the_loop_and_the_turn_wait_keeps_alive():
    # A worker of several topics holding more than its capacity waits for
    # room in its consume loop (which keeps the AMQP connection alive); at
    # capacity a loop takes one more message and waits for its turn with it
    # inside a handler, where it must keep calling its keepalive.
    room = priority.PriorityRoom(capacity=1, ranks=1)
    memory = room.memory()
    never = threading.Event()
    memory.admit(("busy", "execute", None), "r", 0)
    assert room.wait_for_space(never, 0.0) is True  # at capacity: one more in hand
    memory.admit(("over", "execute", None), "r", 0)
    assert room.wait_for_space(never, 0.0) is False
    memory.forget(("over", "execute", None))
    pauses = threading.Semaphore(0)
    result: list[Any] = []
    waiter = threading.Thread(
        target=lambda: result.append(
            room.admit(
                0,
                memory,
                never,
                ("k", "execute", None),
                "r",
                0,
                None,
                True,
                loss_bound=(3, 9.0),
                pause=pauses.release,
            )
        )
    )
    waiter.start()
    assert pauses.acquire(timeout=WAIT_S)  # paused at least once while full
    memory.forget(("busy", "execute", None))
    waiter.join(WAIT_S)
    assert result[0].kind == held.NEW and result[0].held.loss_bound == (3, 9.0)
    memory.forget(("k", "execute", None))
    assert room.wait_for_space(never, WAIT_S) is True


# --- exception handlers ---


def _failed() -> eh.FailedRequest:
    return eh.FailedRequest(
        "t", "m.T", "execute", "r-1", 0, "w-1", ft.Failure.from_exception(ValueError("boom")), 0.1
    )


def test_handlers_run_in_order_and_false_stops_the_chain(caplog):
    seen: list[str] = []
    chain = eh.HandlerChain(
        [
            lambda f: seen.append("first"),
            lambda f: seen.append("second") or False,
            lambda f: seen.append("third"),
        ]
    )
    chain(_failed())
    assert seen == ["first", "second"]
    assert "failed in" not in caplog.text  # the default handler did not run


def test_a_raising_handler_is_logged_and_the_default_still_runs(caplog):
    def broken(failed: eh.FailedRequest) -> None:
        raise RuntimeError("handler bug")

    eh.HandlerChain([broken])(_failed())
    assert "Exception handler" in caplog.text and "handler bug" in caplog.text
    assert "Task 't' (m.T) execute for request r-1 failed in 0.100 s: boom" in caplog.text


@pytest.mark.parametrize(
    "spec, error, text",
    [
        ("nocolon", ValueError, "expected 'module:function'"),
        ("json:nothing_here", ImportError, "has no 'nothing_here'"),
        ("json:__name__", ValueError, "is not callable"),
    ],
)
def test_a_bad_handler_name_is_refused(spec, error, text):
    with pytest.raises(error) as info:
        eh.load_handler(spec)
    assert text in str(info.value)
