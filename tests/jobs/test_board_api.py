"""TaskFlow's jobboard API, on every board kind: post, iterate, claim, consume, abandon, trash."""

from __future__ import annotations

import threading

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.jobs import base
from flowengine.persistence.backends import impl_memory
from flowengine.utils import persistence_utils as p_utils

WAIT_S = 10.0


def test_connect_and_close(boards):
    board = boards.make(connect=False)
    assert not board.connected
    board.connect()
    assert board.connected
    board.close()
    assert not board.connected


def _connect_at_once(made: list) -> list[BaseException]:
    """Connect every board of ``made`` from its own thread at the same moment; the errors."""
    start = threading.Barrier(len(made))
    failures: list[BaseException] = []

    def connect(board) -> None:
        start.wait(WAIT_S)
        try:
            board.connect()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            failures.append(e)

    threads = [threading.Thread(target=connect, args=(b,)) for b in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 3)
    return failures


def test_boards_connecting_at_once_to_a_fresh_namespace(boards):
    # Given several boards (as conductor processes starting together) on a
    # namespace nothing was written to yet, a few times over
    for fresh in (boards, boards.fresh(), boards.fresh()):
        made = [fresh.make(connect=False) for _ in range(5)]
        try:
            # When they all connect at the same moment
            failures = _connect_at_once(made)
            # Then every one of them connected (TaskFlow's boards do)
            assert not failures, failures
            assert all(b.connected for b in made)
            job = made[0].post("test", p_utils.temporary_log_book())
            assert all(b.get_job(job.uuid) == job for b in made)
        finally:
            fresh.close()


def test_operations_on_a_closed_board_say_so(boards):
    # Given a job read while connected
    board = boards.make()
    job = board.post("test", p_utils.temporary_log_book())
    # When the board is closed
    board.close()
    # Then reading the job's state raises JobFailure naming the cause
    with pytest.raises(exc.JobFailure, match="not connected"):
        _ = job.state


def test_empty_board(boards):
    board = boards.make()
    assert list(board.iterjobs()) == []
    assert board.job_count == 0


def test_post_then_iterate(boards):
    board = boards.make()
    posted = board.post("test", p_utils.temporary_log_book(), details={"a": [1, []]})
    other = boards.make()
    jobs = list(other.iterjobs(ensure_fresh=True))
    assert [j.uuid for j in jobs] == [posted.uuid]
    assert jobs[0].state == states.UNCLAIMED
    assert jobs[0].details == {"a": [1, []]}  # JSON round trip keeps empty lists
    assert jobs[0].book_uuid == posted.book_uuid
    assert jobs[0].created_on is not None
    assert other.job_count == 1


def test_iteration_order_is_priority_then_age(boards):
    board = boards.make()
    low = board.post("low", priority="LOW")
    first = board.post("first")
    urgent = board.post("urgent", priority=base.JobPriority.VERY_HIGH)
    second = board.post("second")
    assert [j.uuid for j in board.iterjobs()] == [urgent.uuid, first.uuid, second.uuid, low.uuid]


def test_bad_priority_is_named(boards):
    board = boards.make()
    with pytest.raises(ValueError, match="'urgentish' is not a valid priority"):
        board.post("x", priority="urgentish")


def test_details_must_be_json(boards):
    board = boards.make()
    with pytest.raises(exc.JobFailure, match="JSON-serialisable"):
        board.post("x", details={"when": object()})
    assert board.job_count == 0


def test_claim_and_owner(boards):
    board = boards.make()
    board.post("test")
    job = next(iter(board.iterjobs(only_unclaimed=True)))
    assert board.find_owner(job) is None  # TaskFlow's Redis board raised TypeError here
    board.claim(job, "me")
    assert board.find_owner(job) == "me"
    assert job.state == states.CLAIMED
    assert job.token > 0 and job.attempt == 1
    assert list(board.iterjobs(only_unclaimed=True)) == []


def test_a_claimed_job_cannot_be_claimed_again(boards):
    board, rival = boards.make(), boards.make()
    board.post("test")
    job = next(iter(board.iterjobs()))
    board.claim(job, "me")
    theirs = next(iter(rival.iterjobs()))
    with pytest.raises(exc.UnclaimableJob, match="already claimed by me"):
        rival.claim(theirs, "them")
    with pytest.raises(exc.UnclaimableJob):
        board.claim(job, "me")  # same owner twice: still refused (TaskFlow)


def test_claimant_must_be_a_non_empty_string(boards):
    board = boards.make()
    job = board.post("test")
    with pytest.raises(TypeError):
        board.claim(job, 42)
    with pytest.raises(ValueError):
        board.claim(job, "")


def test_consume(boards):
    board = boards.make()
    job = board.post("test")
    board.claim(job, "me")
    board.consume(job, "me")
    assert list(board.iterjobs()) == []
    assert job.state == states.COMPLETE
    assert job.outcome.outcome == "succeeded" and job.outcome.who == "me"
    with pytest.raises(exc.NotFound):
        board.consume(job, "me")


def test_consume_by_someone_else_is_refused(boards):
    board = boards.make()
    job = board.post("test")
    board.claim(job, "me")
    with pytest.raises(exc.JobFailure, match="not owned by you"):
        board.consume(job, "you")
    assert job.state == states.CLAIMED


def test_abandon_makes_it_claimable_again(boards):
    board = boards.make()
    job = board.post("test")
    board.claim(job, "me")
    board.abandon(job, "me")
    assert [j.uuid for j in board.iterjobs(only_unclaimed=True)] == [job.uuid]
    assert board.find_owner(job) is None


def test_abandon_unclaimed_is_not_found(boards):
    board = boards.make()
    job = board.post("test")
    with pytest.raises(exc.NotFound):
        board.abandon(job, job.name)


def test_trash_keeps_the_job_for_review(boards):
    board = boards.make()
    job = board.post("test")
    board.claim(job, "me")
    board.trash(job, "me", reason="broken input")
    assert job.state == states.COMPLETE
    assert [j.uuid for j in board.trashed()] == [job.uuid]
    assert job.outcome.outcome == "trashed" and job.outcome.reason == "broken input"


def test_job_wait(boards):
    board = boards.make()
    job = board.post("test")
    assert not job.wait(0.1)
    board.claim(job, "me")
    board.consume(job, "me")
    assert job.wait()


def test_board_wait_times_out(boards):
    board = boards.make()
    with pytest.raises(exc.NotFound):
        board.wait(timeout=0.1)


def test_board_wait_wakes_on_a_post_by_another_board(boards):
    # Given a board object waiting for jobs
    waiter, poster = boards.make(), boards.make()
    found, ready = [], threading.Event()

    def wait() -> None:
        ready.set()
        found.extend(waiter.wait(timeout=WAIT_S))

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    assert ready.wait(WAIT_S)
    # When another board object posts
    job = poster.post("test")
    t.join(WAIT_S)
    # Then the waiter returns with it
    assert [j.uuid for j in found] == [job.uuid]


def test_book_is_loaded_from_persistence(boards, tmp_path):
    backend = impl_memory.MemoryBackend()
    book, flow_detail = p_utils.temporary_flow_detail(backend)
    board = boards.make(persistence=backend)
    board.post("test", book)
    job = next(iter(board.iterjobs()))
    assert job.book_uuid == book.uuid and job.book_name == book.name
    assert [fd.uuid for fd in job.book] == [flow_detail.uuid]


def test_notifier_posted_and_removal(boards):
    board = boards.make()
    seen: list[tuple[str, str]] = []
    removed = threading.Event()

    def on_event(event: str, details: dict) -> None:
        seen.append((event, details["job_uuid"]))
        if event == base.REMOVAL:
            removed.set()

    board.notifier.register(base.POSTED, on_event)
    board.notifier.register(base.REMOVAL, on_event)
    job = board.post("test")
    board.claim(job, "me")
    board.consume(job, "me")
    assert removed.wait(WAIT_S)
    assert seen == [(base.POSTED, job.uuid), (base.REMOVAL, job.uuid)]


def test_details_are_masked_in_str_but_not_in_details(boards):
    board = boards.make()
    job = board.post("test", details={"flow_uuid": "f", "store": {"db_password": "hunter2"}})
    assert "hunter2" not in str(job) and "***" in str(job)
    assert job.details["store"]["db_password"] == "hunter2"
    everything = boards.make(mask_details="all")
    assert "'f'" in str(everything.get_job(job.uuid)) and "db_password" not in str(
        everything.get_job(job.uuid)
    )


#: The class name each board's jobs carry in str(job): TaskFlow's where it has
#: the board (RedisJob, ZookeeperJob), the board's own name otherwise.
JOB_CLASS_NAMES = {
    "memory": "MemoryJob",
    "redis": "RedisJob",
    "sqlite": "SQLJob",
    "postgresql": "SQLJob",
    "zookeeper": "ZookeeperJob",
    "etcd": "EtcdJob",
}


def test_str_names_the_boards_job_class(boards):
    board = boards.make()
    posted = board.post("test", details={"flow_uuid": "f"})
    name = JOB_CLASS_NAMES[boards.kind]
    for job in (posted, board.get_job(posted.uuid), *board.iterjobs()):
        assert type(job).__name__ == name
        assert str(job) == (
            f"{name}: test (priority={job.priority}, uuid={job.uuid}, details={{'flow_uuid': 'f'}})"
        )
    assert isinstance(posted, base.Job)


def test_job_classes_have_taskflows_names_and_homes():
    pytest.importorskip("redis")
    pytest.importorskip("kazoo")
    from flowengine.jobs.backends import impl_redis, impl_zookeeper

    assert impl_redis.RedisJobBoard.JOB_CLASS is impl_redis.RedisJob
    assert impl_zookeeper.ZookeeperJobBoard.JOB_CLASS is impl_zookeeper.ZookeeperJob
    tf_redis = pytest.importorskip("taskflow.jobs.backends.impl_redis")
    tf_zk = pytest.importorskip("taskflow.jobs.backends.impl_zookeeper")
    assert impl_redis.RedisJob.__name__ == tf_redis.RedisJob.__name__
    assert impl_zookeeper.ZookeeperJob.__name__ == tf_zk.ZookeeperJob.__name__


def test_jobs_sort_and_compare(boards):
    board = boards.make()
    a, b = board.post("a"), board.post("b")
    again = board.get_job(a.uuid)
    assert again == a and hash(again) == hash(a) and a < b


def test_register_entity(boards):
    from flowengine.types import entity

    board = boards.make()
    board.register_entity(entity.Entity("conductor", "c1@host:1", {"pid": 1}))
