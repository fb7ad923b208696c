"""Helper threads: jobs run at once, on threads earlier jobs left idle."""

from __future__ import annotations

import logging
import threading

import pytest

from flowengine.utils import helper_threads as ht
from tests import waiting

#: Bounds a hang only (s).
WAIT_S = 10.0


def _recording(seen: list[threading.Thread], release: threading.Event | None = None):
    def target() -> None:
        seen.append(threading.current_thread())
        if release is not None:
            assert release.wait(WAIT_S)
    return target


def _idle(threads: ht.HelperThreads, count: int) -> None:
    # Nothing signals a helper going idle (it happens after join() returns).
    waiting.wait_until(lambda: threads.idle_count == count, f"{count} idle helper(s)",
                       timeout=WAIT_S)


def test_a_job_runs_on_a_daemon_thread_named_for_it():
    threads = ht.HelperThreads()
    seen: list[threading.Thread] = []
    names: list[str] = []
    job = threads.start(lambda: (seen.append(threading.current_thread()),
                                 names.append(threading.current_thread().name)), "wbe-x-1")
    assert job.join(WAIT_S)
    assert not job.is_alive()
    assert names == ["wbe-x-1"] and seen[0].daemon
    assert seen[0] is not threading.current_thread()


def test_the_next_job_reuses_the_idle_thread():
    threads = ht.HelperThreads()
    seen: list[threading.Thread] = []
    assert threads.start(_recording(seen), "first").join(WAIT_S)
    _idle(threads, 1)
    assert threads.start(_recording(seen), "second").join(WAIT_S)
    assert seen[0] is seen[1]
    _idle(threads, 1)
    assert seen[0].name == ht.IDLE_NAME


def test_jobs_at_the_same_time_get_threads_of_their_own():
    threads = ht.HelperThreads()
    seen: list[threading.Thread] = []
    release = threading.Event()
    jobs = [threads.start(_recording(seen, release), f"job-{i}") for i in range(3)]
    waiting.wait_until(lambda: len(seen) == 3, "three jobs running", timeout=WAIT_S)
    assert len(set(seen)) == 3 and all(job.is_alive() for job in jobs)
    release.set()
    assert all(job.join(WAIT_S) for job in jobs)


def test_idle_threads_beyond_the_limit_end():
    threads = ht.HelperThreads(max_idle=1)
    seen: list[threading.Thread] = []
    release = threading.Event()
    jobs = [threads.start(_recording(seen, release), f"job-{i}") for i in range(2)]
    waiting.wait_until(lambda: len(seen) == 2, "two jobs running", timeout=WAIT_S)
    release.set()
    assert all(job.join(WAIT_S) for job in jobs)
    _idle(threads, 1)
    # one kept for the next job, the other gone
    waiting.wait_until(lambda: [t.is_alive() for t in seen].count(False) == 1,
                       "the second thread to end", timeout=WAIT_S)
    assert threads.idle_count == 1


def test_an_idle_thread_ends_after_the_idle_period():
    threads = ht.HelperThreads(idle_exit_s=0.05)
    seen: list[threading.Thread] = []
    assert threads.start(_recording(seen), "short").join(WAIT_S)
    seen[0].join(WAIT_S)
    assert not seen[0].is_alive()
    assert threads.idle_count == 0
    # and the next job gets a new thread
    assert threads.start(_recording(seen), "later").join(WAIT_S)
    assert seen[1] is not seen[0]


def test_an_error_is_logged_and_the_thread_serves_again(caplog):
    threads = ht.HelperThreads()
    seen: list[threading.Thread] = []

    def boom() -> None:
        seen.append(threading.current_thread())
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger=ht.__name__):
        assert threads.start(boom, "failing").join(WAIT_S)
    assert "Helper thread failing ended with an error" in caplog.text
    _idle(threads, 1)
    assert threads.start(_recording(seen), "after").join(WAIT_S)
    assert seen[0] is seen[1]


def test_is_current_only_within_the_job():
    threads = ht.HelperThreads()
    inside: list[bool] = []
    holder: list[ht.Job] = []
    started = threading.Event()

    def target() -> None:
        assert started.wait(WAIT_S)
        inside.append(holder[0].is_current())

    holder.append(threads.start(target, "me"))
    assert not holder[0].is_current()
    started.set()
    assert holder[0].join(WAIT_S)
    assert inside == [True]
    assert not holder[0].is_current()


@pytest.mark.parametrize("timeout", [0.0, 0.01])
def test_join_says_whether_the_job_ended(timeout):
    threads = ht.HelperThreads()
    release = threading.Event()
    job = threads.start(lambda: release.wait(WAIT_S), "waiting")
    assert job.join(timeout) is False and job.is_alive()
    release.set()
    assert job.join(WAIT_S) is True
