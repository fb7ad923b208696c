"""Crew: a pool whose free threads take turns running consume loops (leader/followers)."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest
import worker_tasks as wt
from test_proxy import Body, Running, _proxy
from waiting import wait_until

from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.worker_side import worker as wk
from flowengine.engines.worker_based.worker_side.crew import Crew

WAIT_S = 10.0


class Rounds:
    """A fake consume loop: each round runs ``on_round(number)`` until stop()."""

    def __init__(self, on_round=None):
        self.on_round = on_round or (lambda number: None)
        self.stopped = threading.Event()
        self.threads: list[int] = []  # the thread of each round
        self.done = threading.Event()

    def __iter__(self):
        try:
            number = 0
            while not self.stopped.is_set():
                self.threads.append(threading.get_ident())
                self.on_round(number)
                number += 1
                yield
        finally:
            self.done.set()


def drive_in_thread(crew, rounds):
    """crew.drive(rounds) in a thread of its own; the thread and what drive() raised."""
    raised: list[BaseException] = []

    def drive():
        try:
            crew.drive(iter(rounds))
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    return thread, raised


@pytest.fixture
def crew():
    c = Crew(2, thread_name_prefix="crew-test")
    yield c
    c.shutdown(wait=False, cancel_futures=True)


def test_a_call_submitted_from_outside_runs_on_a_crew_thread(crew):
    future = crew.submit(lambda a, b=0: (a + b, threading.current_thread().name), 1, b=2)
    total, name = future.result(WAIT_S)
    assert total == 3
    assert name.startswith("crew-test-")


def test_a_call_taken_in_a_round_runs_on_the_thread_that_ran_the_round(crew):
    ran_on: list[int] = []
    round_threads: list[int] = []
    called = threading.Event()

    def on_round(number):
        if number == 0:
            round_threads.append(threading.get_ident())
            crew.submit(lambda: (ran_on.append(threading.get_ident()), called.set()))
        else:
            rounds.stopped.wait(0.01)

    rounds = Rounds(on_round)
    thread, raised = drive_in_thread(crew, rounds)
    assert called.wait(WAIT_S)
    rounds.stopped.set()
    thread.join(WAIT_S)
    assert not thread.is_alive() and not raised
    assert ran_on == round_threads


def test_the_loop_goes_on_on_another_thread_while_the_call_it_took_runs(crew):
    release = threading.Event()
    call_thread: list[int] = []

    def blocking_call():
        call_thread.append(threading.get_ident())
        release.wait(WAIT_S)

    def on_round(number):
        if number == 0:
            crew.submit(blocking_call)
        else:
            rounds.stopped.wait(0.01)

    rounds = Rounds(on_round)
    thread, raised = drive_in_thread(crew, rounds)
    try:
        wait_until(lambda: len(rounds.threads) >= 3, "rounds after the call started",
                   timeout=WAIT_S)
        assert not release.is_set()
        assert call_thread and call_thread[0] == rounds.threads[0]
        assert call_thread[0] not in rounds.threads[1:]
    finally:
        release.set()
        rounds.stopped.set()
    thread.join(WAIT_S)
    assert not raised


def test_at_most_max_workers_calls_run_at_once_and_the_loop_still_runs(crew):
    lock = threading.Lock()
    running = [0, 0]  # now, peak
    release = threading.Event()

    def call():
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        release.wait(WAIT_S)
        with lock:
            running[0] -= 1

    futures: list[cf.Future] = []

    def on_round(number):
        if number < 5:
            futures.append(crew.submit(call))
        else:
            rounds.stopped.wait(0.01)

    rounds = Rounds(on_round)
    thread, raised = drive_in_thread(crew, rounds)
    try:
        # Both slots taken, three calls waiting, and rounds still going on.
        wait_until(lambda: running[0] == 2 and len(rounds.threads) >= 10,
                   "two calls running and rounds going on", timeout=WAIT_S)
        assert sum(f.running() for f in futures) == 2
        assert sum(not f.running() and not f.done() for f in futures) == 3
    finally:
        release.set()
    cf.wait(futures, WAIT_S)
    assert all(f.done() and f.exception() is None for f in futures)
    assert running[1] == 2
    rounds.stopped.set()
    thread.join(WAIT_S)
    assert not raised


def test_drive_returns_when_the_rounds_end_and_raises_what_a_round_raised(crew):
    def on_round(number):
        if number == 2:
            raise ValueError("round 2 broke")

    rounds = Rounds(on_round)
    with pytest.raises(ValueError, match="round 2 broke"):
        crew.drive(iter(rounds))
    assert rounds.done.is_set()


def test_two_loops_each_keep_a_thread_while_every_call_slot_is_busy(crew):
    release = threading.Event()
    blocked = [crew.submit(release.wait, WAIT_S) for _ in range(2)]
    loops = [Rounds(), Rounds()]
    for rounds in loops:
        rounds.on_round = lambda number, r=rounds: r.stopped.wait(0.005)
    driving = [drive_in_thread(crew, rounds) for rounds in loops]
    try:
        wait_until(lambda: all(len(r.threads) >= 5 for r in loops),
                   "rounds of both loops", timeout=WAIT_S)
        assert not any(f.done() for f in blocked)
    finally:
        release.set()
        for rounds in loops:
            rounds.stopped.set()
    for thread, raised in driving:
        thread.join(WAIT_S)
        assert not thread.is_alive() and not raised


def test_shutdown_refuses_new_calls_and_waits_for_submitted_ones():
    crew = Crew(1)
    release = threading.Event()
    first = crew.submit(release.wait, WAIT_S)
    second = crew.submit(lambda: "second")
    crew.shutdown(wait=False)
    with pytest.raises(RuntimeError, match="after shutdown"):
        crew.submit(lambda: None)
    waiting = threading.Thread(target=crew.shutdown, daemon=True)
    waiting.start()
    waiting.join(0.05)
    assert waiting.is_alive() and not second.done()  # both calls still to finish
    release.set()
    waiting.join(WAIT_S)
    assert not waiting.is_alive()
    assert first.result(0) is True and second.result(0) == "second"


def test_shutdown_can_cancel_what_did_not_start():
    crew = Crew(1)
    release = threading.Event()
    first = crew.submit(release.wait, WAIT_S)
    wait_until(first.running, "the first call running", timeout=WAIT_S)
    second = crew.submit(lambda: "never")
    crew.shutdown(wait=False, cancel_futures=True)
    assert second.cancelled()
    release.set()
    assert first.result(WAIT_S) is True


def test_max_workers_must_be_positive():
    with pytest.raises(ValueError, match="max_workers"):
        Crew(0)


def test_a_worker_that_owns_its_pool_runs_requests_on_a_crew():
    worker = wk.Worker("ex", "t", [wt.Add], threads_count=3, transport="memory")
    try:
        assert isinstance(worker._executor, Crew)
        assert worker.describe()["threads"] == 3
    finally:
        worker.stop()


def test_a_consume_loop_driven_by_a_crew_runs_each_message_s_call_on_its_thread(
        broker, unique_name):
    """On each transport: the call a handler submits runs where the message was handled."""
    crew = Crew(2)
    handled_on: list[int] = []
    ran_on: list[int] = []
    ran = threading.Semaphore(0)

    def handler(data, message):
        handled_on.append(threading.get_ident())
        crew.submit(lambda: (ran_on.append(threading.get_ident()), ran.release()))

    proxy = _proxy(broker, unique_name, handler,
                   consume=px.ConsumeOptions(driver=crew.drive))
    try:
        with Running(proxy):
            for i in range(5):
                proxy.publish(Body({"n": i}), "t")
                assert ran.acquire(timeout=WAIT_S), f"message {i} not handled"
        assert ran_on == handled_on
        assert len(ran_on) == 5
    finally:
        crew.shutdown(wait=False)


def test_shutdown_with_no_loop_driven_ends_the_threads():
    crew = Crew(3, thread_name_prefix="crew-ending")
    assert [crew.submit(lambda i=i: i).result(WAIT_S) for i in range(3)] == [0, 1, 2]
    crew.shutdown(wait=True)
    assert not [t for t in threading.enumerate() if t.name.startswith("crew-ending")]


def test_shutdown_from_a_call_it_runs_does_not_wait_for_that_call():
    crew = Crew(2)
    future = crew.submit(lambda: crew.shutdown(wait=True) or "returned")
    assert future.result(WAIT_S) == "returned"
