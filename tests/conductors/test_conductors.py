"""Conductors in this process, on every board kind: TaskFlow's conductor tests and flowengine's.

Each test runs a blocking or nonblocking conductor in a thread over a board
of the parametrised kind, posts jobs the way TaskFlow's tests do (a logbook
with a saved flow factory), and waits on events, never on sleeps.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import futurist
import pytest

from flowengine import engines, exceptions
from flowengine import states as st
from flowengine.conductors import backends as conductors
from flowengine.jobs import base
from flowengine.persistence.backends import impl_memory
from flowengine.utils import persistence_utils as pu

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.conductors import flows  # noqa: E402
from tests.jobs.boards import BOARD_KINDS, Boards  # noqa: E402
from tests.jobs.conftest import board_base_url  # noqa: E402

WAIT_S = 20.0


def single_factory():
    return futurist.ThreadPoolExecutor(max_workers=1)


KINDS = {
    "blocking": ("blocking", {}),
    "nonblocking": ("nonblocking", {}),
    "nonblocking_one_thread": ("nonblocking", {"executor_factory": single_factory}),
}


# Each test runs conductors that wait on their board (about a second a test on
# memory and SQLite): out of the fast tier (tests/fast_tier.py).
pytestmark = pytest.mark.slow

#: Every conductor kind on the memory board; the nonblocking one (threads,
#: the board shared between them) on every other board.
COMBINATIONS = [
    pytest.param(c, b, id=f"{c}-{b}", marks=[pytest.mark.broker] if b == "redis" else [])
    for b in BOARD_KINDS
    for c in sorted(KINDS)
    if b == "memory" or c == "nonblocking"
]


BOARDS = [pytest.param(b, marks=[pytest.mark.broker] if b == "redis" else []) for b in BOARD_KINDS]


@pytest.fixture
def board_kind() -> str:
    """Overridden by each test's parametrisation."""
    return "memory"


@pytest.fixture
def conductor_kind() -> str:
    """Overridden by each test's parametrisation."""
    return "blocking"


@pytest.fixture
def boards(request, board_kind):
    """Board objects of this test's board kind (see COMBINATIONS)."""
    made = Boards(board_kind, board_base_url(board_kind, request))
    yield made
    made.close()


@pytest.fixture
def setup(request, boards, conductor_kind):
    kind, kwargs = KINDS[conductor_kind]
    persistence = impl_memory.MemoryBackend()
    board = boards.make(persistence=persistence, connect=False, lease_s=1.0, backoff_s=0.05)
    conductor = conductors.fetch(
        kind, "testing", board, persistence=persistence, wait_timeout=0.1, **kwargs
    )
    conductor.connect()
    events: dict[str, threading.Event] = {}

    def record(event: str, details: dict) -> None:
        events.setdefault(event, threading.Event()).set()

    conductor.notifier.register("*", record)
    yield conductor, board, persistence, lambda name: events.setdefault(name, threading.Event())
    conductor.stop()
    conductor.wait(WAIT_S)
    conductor.close()


@contextlib.contextmanager
def running(conductor, **kwargs):
    t = threading.Thread(target=conductor.run, kwargs=kwargs, daemon=True)
    t.start()
    try:
        yield t
    finally:
        conductor.stop()
        assert conductor.wait(WAIT_S)
        t.join(WAIT_S)


def post(board, persistence, factory, details=None, meta=None):
    lb, fd = pu.temporary_flow_detail(persistence, meta=meta)
    engines.save_factory_details(fd, factory, [], {}, backend=persistence)
    job = board.post("poke", lb, details={"flow_uuid": fd.uuid, **(details or {})})
    return job, lb, fd


def stored_flow(persistence, lb, fd):
    with contextlib.closing(persistence.get_connection()) as conn:
        return conn.get_logbook(lb.uuid).find(fd.uuid)


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_run_empty(setup):
    conductor, *_ = setup
    with running(conductor):
        pass
    assert not conductor.dispatching


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_run_consumes_a_successful_job(setup):
    conductor, board, persistence, event = setup
    removed = threading.Event()
    board.notifier.register(base.REMOVAL, lambda e, details: removed.set())
    with running(conductor):
        job, lb, fd = post(board, persistence, flows.ok_factory)
        assert removed.wait(WAIT_S)
        assert event("job_consumed").wait(WAIT_S)
        assert job.wait(WAIT_S)
    assert not event("job_abandoned").is_set()
    assert stored_flow(persistence, lb, fd).state == st.SUCCESS
    assert job.outcome.outcome == "succeeded"


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_max_dispatches(setup):
    conductor, board, persistence, _ = setup
    t = threading.Thread(target=conductor.run, kwargs={"max_dispatches": 2}, daemon=True)
    t.start()
    jobs = [post(board, persistence, flows.ok_factory)[0] for _ in range(3)]
    assert conductor.wait(WAIT_S)  # ends by itself after two dispatches
    t.join(WAIT_S)
    assert sum(1 for j in jobs if j.outcome is not None) == 2


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_a_reverted_flow_is_consumed_as_reverted(setup):
    conductor, board, persistence, event = setup
    with running(conductor):
        job, lb, fd = post(board, persistence, flows.boom_factory)
        assert job.wait(WAIT_S)
        assert event("job_consumed").wait(WAIT_S)
    assert stored_flow(persistence, lb, fd).state == st.REVERTED
    assert job.outcome.outcome == "reverted"  # TaskFlow consumed it like a success
    assert not event("job_abandoned").is_set()


@pytest.mark.parametrize("engine", ["serial", "parallel"])
def test_a_reverted_jobs_reason_reads_the_same_on_every_engine(setup, engine):
    conductor, board, persistence, event = setup
    with running(conductor):
        job, *_ = post(board, persistence, flows.boom_factory, details={"engine": engine})
        assert job.wait(WAIT_S)
    assert (job.outcome.outcome, job.outcome.reason) == ("reverted", "RuntimeError: boom")


def test_a_wrapped_failure_is_worded_as_its_failures():
    from flowengine import exceptions as exc
    from flowengine.conductors.backends.outcomes import reason_of
    from flowengine.types.failure import Failure

    def failure(error):
        try:
            raise error
        except Exception:
            return Failure()

    one = exc.WrappedFailure([failure(RuntimeError("boom"))])
    two = exc.WrappedFailure([failure(RuntimeError("boom")), failure(KeyError("k"))])
    assert reason_of(one) == reason_of(RuntimeError("boom")) == "RuntimeError: boom"
    assert reason_of(two) == "RuntimeError: boom; KeyError: 'k'"


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_missing_inputs_fail_and_are_consumed(setup):
    conductor, board, persistence, _ = setup
    with running(conductor):
        job, lb, fd = post(board, persistence, flows.store_factory)
        assert job.wait(WAIT_S)
    assert stored_flow(persistence, lb, fd).state is None
    assert job.outcome.outcome == "failed"


@pytest.mark.parametrize("where", ["job", "flow", "both"])
@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_store_from_job_and_flow_detail(setup, where):
    conductor, board, persistence, _ = setup
    values = {"x": True, "y": False, "z": None}
    job_store = values if where == "job" else {"z": None} if where == "both" else {}
    meta = (
        {"store": values}
        if where == "flow"
        else {"store": {"x": True, "y": False}}
        if where == "both"
        else None
    )
    with running(conductor):
        job, lb, fd = post(
            board, persistence, flows.store_factory, details={"store": job_store}, meta=meta
        )
        assert job.wait(WAIT_S)
    assert stored_flow(persistence, lb, fd).state == st.SUCCESS


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_stop_abandons_the_running_job_at_once(setup):
    conductor, board, persistence, event = setup
    flows.GATE.clear()
    flows.AT_GATE.clear()
    t = threading.Thread(target=conductor.run, daemon=True)
    t.start()
    job, lb, fd = post(board, persistence, flows.gate_factory)
    assert flows.AT_GATE.wait(WAIT_S)
    # When the conductor is stopped while a task runs
    conductor.stop()
    # Then the job is back on the board before that task even finished
    assert event("job_abandoned").wait(WAIT_S)
    assert board.job_state(job) == st.UNCLAIMED and not flows.GATE.is_set()
    flows.GATE.set()
    assert conductor.wait(WAIT_S)
    t.join(WAIT_S)
    assert not event("job_consumed").is_set()
    assert job.outcome is None
    # and it was not counted as a failed attempt
    assert board.get_job(job.uuid).record.attempts == 0


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_stop_from_running_end_still_consumes_the_finished_job(setup):
    conductor, board, persistence, _ = setup
    seen: list[str] = []
    wanted = ("running_end", "job_consumed", "job_abandoned", "job_trashed", "job_lost")
    conductor.notifier.register("*", lambda e, details: seen.append(e) if e in wanted else None)
    # Given a listener that stops the conductor once the flow ran to its end (TaskFlow's way)
    conductor.notifier.register("running_end", lambda e, details: conductor.stop())
    job, lb, fd = post(board, persistence, flows.ok_factory)
    t = threading.Thread(target=conductor.run, daemon=True)
    t.start()
    t.join(WAIT_S)
    assert not t.is_alive()
    # Then the job was consumed, not given back: TaskFlow's events and an empty board
    assert seen == ["running_end", "job_consumed"]
    assert board.job_count == 0
    assert job.outcome is not None and job.outcome.outcome == "succeeded"
    assert stored_flow(persistence, lb, fd).state == st.SUCCESS


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_transient_failures_back_off_then_dead_letter(setup):
    conductor, board, persistence, event = setup
    with running(conductor):
        job, lb, fd = post(board, persistence, flows.down_factory)
        found = board.wait_for_outcome(job, WAIT_S)
    assert found is not None and found.outcome == "dead"
    assert found.attempts == board.policy.max_attempts
    assert event("job_dead").wait(WAIT_S)
    assert [j.uuid for j in board.dead_letters()] == [job.uuid]


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_an_unloadable_job_is_trashed(setup):
    conductor, board, persistence, event = setup
    with running(conductor):
        lb, _fd = pu.temporary_flow_detail(persistence)
        job = board.post("poke", lb, details={"flow_uuid": "no-such-flow-detail"})
        found = board.wait_for_outcome(job, WAIT_S)
    assert found.outcome == "trashed" and "no-such-flow-detail" in found.reason
    assert event("job_trashed").wait(WAIT_S)


class _StoreDownAtFirst(impl_memory.MemoryBackend):
    """A memory store whose first logbook read fails as an unreachable server's would."""

    def __init__(self) -> None:
        super().__init__()
        self.failures_left = 1

    def get_connection(self) -> impl_memory.MemoryConnection:
        backend = self

        class Connection(impl_memory.MemoryConnection):
            def get_logbook(self, book_uuid, lazy=False):
                if backend.failures_left:
                    backend.failures_left -= 1
                    raise exceptions.StorageFailure(
                        "Storage backend internal error: ConnectionLoss"
                    )
                return super().get_logbook(book_uuid, lazy=lazy)

        return Connection(self)


@pytest.mark.parametrize("board_kind", ["memory"])
def test_a_store_unreachable_when_the_flow_loads_fails_the_attempt_not_the_job(boards):
    # Given a conductor whose store cannot be read the first time a job loads
    persistence = _StoreDownAtFirst()
    board = boards.make(persistence=persistence, connect=False, lease_s=1.0, backoff_s=0.05)
    conductor = conductors.fetch(
        "nonblocking", "testing", board, persistence=persistence, wait_timeout=0.1
    )
    conductor.connect()
    with running(conductor):
        job, _lb, _fd = post(board, persistence, flows.ok_factory)
        found = board.wait_for_outcome(job, WAIT_S)
    # Then the job is not trashed: that attempt failed, and the next one ran it
    assert persistence.failures_left == 0
    assert found is not None and found.outcome == "succeeded", found
    assert found.attempts == 2


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_engine_named_by_the_job(setup):
    conductor, board, persistence, _ = setup
    seen = []
    conductor.notifier.register(
        "running_start", lambda e, details: seen.append(type(details["engine"]).__name__)
    )
    with running(conductor):
        job, *_ = post(
            board,
            persistence,
            flows.ok_factory,
            details={"engine": "parallel", "engine_options": {"max_workers": 2}},
        )
        assert job.wait(WAIT_S)
    assert seen == ["ParallelActionEngine"]


@pytest.mark.parametrize("board_kind", BOARDS)
def test_bad_wait_timeout_and_factory(boards):
    board = boards.make(connect=False)
    with pytest.raises(ValueError):
        conductors.fetch("nonblocking", "t", board, wait_timeout="testing")
    with pytest.raises(ValueError):
        conductors.fetch("nonblocking", "t", board, executor_factory="testing")


@pytest.mark.parametrize("board_kind", BOARDS)
def test_unknown_kind(boards):
    from flowengine import exceptions as exc

    with pytest.raises(exc.NotFound, match="Could not find conductor 'turbo'"):
        conductors.fetch("turbo", "t", boards.make(connect=False))


@pytest.mark.parametrize("answer", ["unreachable", "resent_by_the_client"])
@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_a_consume_whose_answer_was_lost_is_known_done_when_sent_again(setup, answer):
    from flowengine import exceptions as exc

    conductor, board, persistence, event = setup
    # Given a board server that applies the conductor's consume but whose
    # answer never arrives (it fails over, or the connection drops): the
    # consume is sent again, by the conductor or inside the client
    store, finish = board._store, board._store.finish
    applied = []

    def finish_answer_lost(*args, **kwargs):
        done = finish(*args, **kwargs)
        if applied:
            return done
        applied.append(done)
        if answer == "unreachable":
            raise exc.BoardUnavailable("connection lost before the answer")
        return finish(*args, **kwargs)  # sent again at once: the job is gone

    store.finish = finish_answer_lost
    with running(conductor):
        # When the conductor finishes a job
        job, *_ = post(board, persistence, flows.ok_factory)
        assert event("job_consumed").wait(WAIT_S)
    # Then it knows its own consume by the outcome kept under its claim:
    # consumed once, not lost nor reported as a failure to consume
    assert [done.outcome for done in applied] == ["succeeded"]  # applied once
    assert job.outcome.outcome == "succeeded" and job.outcome.who == "testing"
    assert not event("job_lost").is_set()
    assert not event("job_abandoned").is_set()


def test_a_finish_refused_under_another_claim_is_not_taken_for_ours():
    import logging

    from flowengine.conductors.backends import outcomes
    from flowengine.jobs import records

    class Job:
        token = 7

    class Board:
        def __init__(self, done):
            self.done = done

        def outcome(self, job):
            return self.done

    class Conductor:
        _name = "testing"
        _log = logging.getLogger(__name__)

        def __init__(self, done):
            self._jobboard = Board(done)

    def applied(done):
        return outcomes.Finisher(Conductor(done))._applied_before(Job())

    mine = records.Outcome("u", records.SUCCEEDED, "testing", 7)
    assert applied(mine) is mine
    assert applied(records.Outcome("u", records.SUCCEEDED, "testing", 8)) is None  # a later claim
    assert applied(records.Outcome("u", records.SUCCEEDED, "rival", 7)) is None
    assert applied(None) is None


@pytest.mark.parametrize("conductor_kind,board_kind", COMBINATIONS)
def test_a_lost_lease_suspends_the_engine_and_its_writes_are_refused(setup, boards):
    from flowengine import exceptions as exc
    from flowengine.persistence import fencing

    conductor, board, persistence, event = setup
    flows.GATE.clear()
    flows.AT_GATE.clear()
    with running(conductor):
        # Given the conductor running a task, its lease renewals cut off (a partition)
        job, lb, fd = post(board, persistence, flows.gate_factory)
        assert flows.AT_GATE.wait(WAIT_S)
        lost = threading.Event()
        board.on_claim_lost(job, lambda _job: lost.set())
        store, renew = board._store, board._store.renew
        store.renew = lambda held, lease_s: (_ for _ in ()).throw(exc.BoardUnavailable("cut"))
        # When another board claims the job once the lease ran out, fences it and finishes it
        rival = boards.make(persistence=persistence)
        deadline = time.monotonic() + WAIT_S
        while rival.job_state(job) != st.UNCLAIMED:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        theirs = rival.get_job(job.uuid)
        rival.claim(theirs, "rival")
        fencing.FencedBackend(persistence, fencing.Fence(fd.uuid, theirs.token)).advance()
        rival.consume(theirs, "rival")
        # And the partition heals while the old task is still running
        store.renew = renew
        assert lost.wait(WAIT_S)  # the keeper learnt it: the engine is suspended now
        flows.GATE.set()
        assert event("job_lost").wait(WAIT_S)
    # Then the old engine's writes were refused: its task result never landed
    stored = stored_flow(persistence, lb, fd)
    assert next(ad for ad in stored if ad.name == "g").state != st.SUCCESS
    assert job.outcome.who == "rival"
    assert not event("job_consumed").is_set()
