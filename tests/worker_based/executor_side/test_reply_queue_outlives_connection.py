"""On RabbitMQ, a reply sent while the engine reconnects waits for it.

An engine's reply queue used to be auto-delete: RabbitMQ deleted it, with
what it held, the moment the engine's connection broke, and a reply sent
before the engine declared it again went nowhere. The task had finished,
but the engine heard nothing, found the request lost and ran it again. The
queue now outlives its connection for topology.RECONNECT_GRACE_S.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import amqp.exceptions
import kombu
import pytest

from flowengine import task
from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based import protocol as pr
from tests import faultproxy, waiting
from tests.worker_based.executor_helpers import running_executor, running_worker, unique

#: Bounded waits (s), only so that a bug fails the test instead of hanging it.
WAIT_S = 60.0

_wait_until = functools.partial(waiting.wait_until, timeout=WAIT_S, poll_s=0.05)

#: What the gated task's runs did (one test at a time uses them).
_STARTED = threading.Event()
_RELEASE = threading.Event()
_FINISHED = threading.Event()
_RUNS: list[str] = []


class Gated(task.Task):
    """Runs until the test releases it; counts its runs."""

    def execute(self) -> str:
        _RUNS.append(self.name)
        _STARTED.set()
        try:
            assert _RELEASE.wait(WAIT_S), "never released"
            return "done"
        finally:
            _FINISHED.set()


def _queue_state(url: str, queue: str) -> Any:
    """(message count, consumer count) of ``queue`` on the broker, None if it is gone."""
    with kombu.Connection(url) as conn:
        try:
            declared = conn.default_channel.queue_declare(queue, passive=True)
        except amqp.exceptions.NotFound:
            return None
    return declared.message_count, declared.consumer_count


@pytest.mark.broker
def test_a_reply_sent_while_the_engine_reconnects_reaches_it_and_the_task_runs_once(amqp_url):
    for event in (_STARTED, _RELEASE, _FINISHED):
        event.clear()
    _RUNS.clear()
    exchange = unique()
    with (
        faultproxy.running(faultproxy.port_of(amqp_url)) as link,
        running_worker(exchange, "t", [Gated], url=amqp_url),
        running_executor(exchange, ["t"], url=link.url(amqp_url)) as executor,
    ):
        try:
            _break_and_mend_the_engines_link(amqp_url, exchange, link, executor)
        finally:
            _RELEASE.set()  # a failed test does not wait for the task


def _break_and_mend_the_engines_link(
    amqp_url: str, exchange: str, link: faultproxy.FaultProxy, executor: Any
) -> None:
    queue = pr.reply_queue_name(exchange, executor.uuid)
    # Given a task running on a worker for an engine behind a proxy
    future = executor.execute_task(Gated("g"), "u-1", {})
    assert _STARTED.wait(WAIT_S), "the task did not start"
    # When the engine's connections break and it cannot reconnect yet
    link.blackhole()
    assert link.cut() >= 1
    _wait_until(
        lambda: (state := _queue_state(amqp_url, queue)) is None or state[1] == 0,
        "the broker saw the engine's consumer go",
    )
    # Then its reply queue is still there,
    assert _queue_state(amqp_url, queue) is not None, "the reply queue went with its consumer"
    # and the reply the worker sends meanwhile waits in it
    _RELEASE.set()
    assert _FINISHED.wait(WAIT_S)
    _wait_until(
        lambda: (_queue_state(amqp_url, queue) or (0, 0))[0] > 0,
        "the worker's reply reached the reply queue",
    )
    # until the engine is back, which gets the result of the one run.
    link.heal()
    assert future.result(WAIT_S) == (base.EXECUTED, "done")
    assert executor._proxy.reconnect_count >= 1
    assert _RUNS == ["g"]
