"""Delivery tags of flowengine's memory and filesystem channels (transports/tags.py)."""

from __future__ import annotations

import multiprocessing
import threading
import uuid

import kombu
import pytest

from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.transports import tags

#: Tags each thread draws in the uniqueness test.
PER_THREAD = 2000

#: Bound (s) on waiting for a child process, so a bug fails instead of hanging.
CHILD_WAIT_S = 30.0


def test_tags_are_unique_across_threads():
    # Given four threads drawing tags at once
    drawn: list[list[str]] = [[] for _ in range(4)]

    def draw(into: list[str]) -> None:
        into.extend(tags.next_tag() for _ in range(PER_THREAD))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then no tag was handed out twice
    every = [tag for into in drawn for tag in into]
    assert len(set(every)) == len(every) == 4 * PER_THREAD


def _child_tags(queue: multiprocessing.Queue) -> None:
    queue.put((tags.process_tag(), tags.next_tag()))


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_a_forked_child_draws_tags_of_its_own():
    # Given a tag drawn here, then one drawn in a forked child (same counter state)
    mine = tags.next_tag()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_tags, args=(queue,))
    child.start()
    their_tag, theirs = queue.get(timeout=CHILD_WAIT_S)
    child.join(CHILD_WAIT_S)
    # Then the child's tag is its own: its names cannot repeat ours
    assert mine.startswith(tags.process_tag() + "-")
    assert theirs.startswith(their_tag + "-")
    assert their_tag != tags.process_tag()
    assert theirs != tags.next_tag()


def test_memory_messages_keep_their_body_and_get_counter_tags():
    # Given a message published through flowengine's memory transport
    name = f"tags-{uuid.uuid4().hex[:8]}"
    exchange = kombu.Exchange(name, type="direct", durable=False)
    queue = kombu.Queue(name, exchange, routing_key=name, durable=False, auto_delete=True)
    received: list[kombu.Message] = []
    with kombu.Connection(transport=transports.resolve(None, "memory")) as conn:
        with conn.Consumer(
            queue, callbacks=[lambda body, message: received.append(message)], accept=["json"]
        ):
            conn.Producer().publish(
                {"n": 1}, exchange=exchange, routing_key=name, serializer="json"
            )
            conn.drain_events(timeout=5)
    # Then it arrives as sent, unencoded (no base64 round trip), with a counter tag
    [message] = received
    assert message.decode() == {"n": 1}
    assert message.properties.get("body_encoding") is None
    assert message.delivery_tag.startswith(tags.process_tag() + "-")
