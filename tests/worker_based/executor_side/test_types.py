"""Discovery: TopicWorker and ProxyWorkerFinder (no broker involved)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side import discovery
from flowengine.engines.worker_based.wire import names

# Seconds a test waits for something that should happen at once (bounded
# only so that a bug fails the test instead of hanging it).
WAIT_S = 5.0


class Alpha:
    """Stands in for a task class (only its qualified name matters here)."""


class Beta:
    """Another task class."""


ALPHA = f"{__name__}.Alpha"
BETA = f"{__name__}.Beta"


class FakeProxy:
    """Records what the finder publishes."""

    def __init__(self) -> None:
        self.published: list[tuple] = []

    def publish(self, msg, routing_key, **kwargs) -> None:
        self.published.append((msg, routing_key, kwargs))


class Clock:
    """A manual clock (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def notify(finder, topic, tasks, worker_id=None, leaving=False, settles=False):
    """Deliver a notify response/announcement to the finder."""
    headers = {}
    if worker_id is not None:
        headers[pr.HEADER_WORKER_ID] = worker_id
    if leaving:
        headers[pr.HEADER_LEAVING] = True
    if settles:
        headers[names.HEADER_SETTLES_AFTER_RUN] = True
    message = SimpleNamespace(headers=headers, properties={})
    return finder.process_response({"topic": topic, "tasks": list(tasks)}, message)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def proxy():
    return FakeProxy()


@pytest.fixture
def finder(proxy, clock):
    f = discovery.ProxyWorkerFinder(
        "executor-1", proxy, ["t1", "t2"], beat_periodicity=5, worker_expiry=60
    )
    f._clock = clock
    return f


class TestTopicWorker:
    def test_is_read_only(self):
        w = discovery.TopicWorker("t1", [ALPHA], identity=1)
        with pytest.raises(AttributeError):
            w.topic = "other"
        assert w.tasks == (ALPHA,)

    def test_performs_accepts_class_instance_and_name(self):
        w = discovery.TopicWorker("t1", [Alpha])
        assert w.performs(Alpha)
        assert w.performs(Alpha())
        assert w.performs(ALPHA)
        assert not w.performs(Beta)

    def test_equality_with_wildcard_identity(self):
        a = discovery.TopicWorker("t1", [ALPHA, BETA], identity=1)
        b = discovery.TopicWorker("t1", [BETA, ALPHA])
        c = discovery.TopicWorker("t1", [ALPHA, BETA], identity=2)
        assert a == b and b == c
        assert a != c
        assert a != discovery.TopicWorker("t2", [ALPHA, BETA], identity=1)

    def test_routing_key_only_with_worker_id(self):
        assert discovery.TopicWorker("t1", [ALPHA], worker_id="h:1:ab").routing_key == "t1.h:1:ab"
        assert discovery.TopicWorker("t1", [ALPHA]).routing_key is None


class TestFinder:
    def test_counts_workers_not_topics(self, finder):
        # Given two workers on the same topic (competing consumers)
        notify(finder, "t1", [ALPHA], worker_id="w1")
        notify(finder, "t1", [ALPHA], worker_id="w2")
        # Then both are known
        assert finder.total_workers == 2
        assert finder.messages_processed == 2
        assert finder.wait_for_workers(2, timeout=0) == 0

    def test_refresh_is_not_a_new_worker(self, finder):
        assert notify(finder, "t1", [ALPHA], worker_id="w1") is not None
        assert notify(finder, "t1", [ALPHA], worker_id="w1") is None
        assert finder.total_workers == 1

    def test_changed_tasks_replace_the_worker(self, finder):
        notify(finder, "t1", [ALPHA], worker_id="w1")
        changed = notify(finder, "t1", [ALPHA, BETA], worker_id="w1")
        assert changed is not None and changed.performs(BETA)
        assert finder.total_workers == 1
        assert finder.get_worker_for_task(BETA) == changed

    def test_taskflow_workers_identified_by_topic_and_tasks(self, finder):
        # Given TaskFlow workers (no worker_id header)
        notify(finder, "t1", [ALPHA, BETA])
        notify(finder, "t1", [BETA, ALPHA])
        assert finder.total_workers == 1
        notify(finder, "t1", [ALPHA])
        assert finder.total_workers == 2

    def test_leaving_notice_removes_worker(self, finder):
        notify(finder, "t1", [ALPHA], worker_id="w1")
        notify(finder, "t1", [], worker_id="w1", leaving=True)
        assert finder.total_workers == 0
        assert finder.get_worker_for_task(ALPHA) is None

    def test_wait_for_workers_returns_missing_on_timeout(self, finder):
        notify(finder, "t1", [ALPHA], worker_id="w1")
        assert finder.wait_for_workers(3, timeout=0.01) == 2

    def test_wait_for_workers_rejects_nonpositive(self, finder):
        with pytest.raises(ValueError):
            finder.wait_for_workers(0)

    def test_wait_for_workers_wakes_on_arrival(self, finder):
        result: list[int] = []
        waiting = threading.Event()

        def waiter():
            waiting.set()
            result.append(finder.wait_for_workers(1, timeout=WAIT_S))

        t = threading.Thread(target=waiter)
        t.start()
        assert waiting.wait(WAIT_S)
        notify(finder, "t1", [ALPHA], worker_id="w1")
        t.join(WAIT_S)
        assert result == [0]

    def test_clean_drops_silent_workers(self, finder, clock):
        # Given two workers, one of which stays silent past the expiry
        notify(finder, "t1", [ALPHA], worker_id="quiet")
        clock.now += 30
        notify(finder, "t1", [ALPHA], worker_id="chatty")
        clock.now += 31
        # When cleaning
        assert finder.clean() == 1
        # Then only the silent one is gone
        assert [w.worker_id for w in finder.workers] == ["chatty"]
        clock.now += 60
        assert finder.clean() == 1
        assert finder.total_workers == 0

    def test_clean_disabled_without_expiry(self, proxy, clock):
        f = discovery.ProxyWorkerFinder("e", proxy, ["t1"], worker_expiry=None)
        f._clock = clock
        notify(f, "t1", [ALPHA], worker_id="w1")
        clock.now += 10_000
        assert f.clean() == 0
        assert f.total_workers == 1

    def test_maybe_publish_beats(self, finder, proxy, clock):
        assert finder.maybe_publish()
        msg, keys, kwargs = proxy.published[0]
        assert isinstance(msg, pr.Notify)
        # each topic on its broadcast key (every flowengine worker) and its topic key
        assert keys == ["t1.broadcast", "t1", "t2.broadcast", "t2"]
        assert kwargs["reply_to"] == "executor-1"
        assert not finder.maybe_publish()
        clock.now += 5
        assert finder.maybe_publish()
        assert len(proxy.published) == 2

    def test_reset(self, finder):
        notify(finder, "t1", [ALPHA], worker_id="w1")
        finder.reset()
        assert finder.total_workers == 0
        assert finder.messages_processed == 0


class TestRouting:
    def test_never_routes_to_incapable_worker(self, finder):
        notify(finder, "t1", [BETA], worker_id="w1")
        assert finder.get_worker_for_task(ALPHA) is None
        assert finder.get_route_for_task(Alpha) is None

    def test_homogeneous_topic_uses_topic_key(self, finder):
        notify(finder, "t1", [ALPHA], worker_id="w1")
        notify(finder, "t1", [ALPHA], worker_id="w2")
        keys = {finder.get_route_for_task(ALPHA)[1] for _ in range(4)}
        assert keys == {"t1"}

    def test_heterogeneous_topic_uses_private_key(self, finder):
        # Given two workers on one topic, only one of which runs Beta
        notify(finder, "t1", [ALPHA], worker_id="w1")
        notify(finder, "t1", [ALPHA, BETA], worker_id="w2")
        # Then Beta goes to w2's private queue, Alpha may go to the topic
        for _ in range(4):
            worker, key = finder.get_route_for_task(BETA)
            assert worker.worker_id == "w2" and key == "t1.w2"
        assert {finder.get_route_for_task(ALPHA)[1] for _ in range(4)} == {"t1"}

    def test_heterogeneous_taskflow_worker_without_private_queue_is_skipped(self, finder):
        notify(finder, "t1", [ALPHA])  # TaskFlow worker: no private queue
        notify(finder, "t1", [BETA], worker_id="w2")
        assert finder.get_route_for_task(ALPHA) is None
        assert finder.get_route_for_task(BETA)[1] == "t1.w2"

    def test_load_is_spread_over_topics(self, finder):
        notify(finder, "t1", [ALPHA], worker_id="w1")
        notify(finder, "t2", [ALPHA], worker_id="w2")
        keys = [finder.get_route_for_task(ALPHA)[1] for _ in range(4)]
        assert sorted(keys) == ["t1", "t1", "t2", "t2"]

    def test_routes_follow_membership(self, finder, clock):
        notify(finder, "t1", [ALPHA], worker_id="w1")
        assert finder.get_route_for_task(ALPHA)[1] == "t1"
        notify(finder, "t1", [BETA], worker_id="w2")
        assert finder.get_route_for_task(ALPHA)[1] == "t1.w1"
        notify(finder, "t1", [], worker_id="w2", leaving=True)
        assert finder.get_route_for_task(ALPHA)[1] == "t1"


def test_late_pending_is_asked_only_where_every_reachable_worker_settles_after_run(finder):
    # Nobody known yet: a worker nobody heard from may be one that does not
    assert not finder.settles_after_run("t1")
    # Given two workers of t1 that settle after run
    notify(finder, "t1", [ALPHA], worker_id="w1", settles=True)
    notify(finder, "t1", [ALPHA], worker_id="w2", settles=True)
    assert finder.settles_after_run("t1")
    assert finder.settles_after_run("t1.w1")
    # When a third that does not (TaskFlow's, an older one) joins the topic
    notify(finder, "t1", [ALPHA, BETA], worker_id="w3")
    # Then the topic's queue may reach it: no late PENDING there, but still
    # on the private queues of the two that do
    assert not finder.settles_after_run("t1")
    assert finder.settles_after_run("t1.w2")
    assert not finder.settles_after_run("t1.w3")
    # and once it left, the topic is theirs again
    notify(finder, "t1", [], worker_id="w3", leaving=True)
    assert finder.settles_after_run("t1")
