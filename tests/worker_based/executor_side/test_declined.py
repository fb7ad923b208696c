"""The engine's answer to a redelivered request a worker handed back unrun (``declined``).

The worker side (flagged redeliveries are declined) is exercised against a
real RabbitMQ crash in tests/reliability/test_outages.py; here fake workers
send the declined PENDING and the tests watch what the engine does.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flowengine.engines.action_engine import executor as base
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire import names
from tests.worker_based import executor_tasks as et
from tests.worker_based.executor_helpers import WAIT_S, FakeWorker, running_executor, unique

ECHO = "tests.worker_based.executor_tasks.Echo"

#: The engine's loss bound in these tests (s): also how long it waits for a
#: holder to speak up after a decline.
LOST_AFTER_S = 0.3


def _decline(fake: FakeWorker, message: Any, attempt: int = 0) -> None:
    fake.proxy.publish(
        pr.Response(pr.PENDING),
        message.properties["reply_to"],
        correlation_id=message.properties["correlation_id"],
        headers={
            pr.HEADER_WORKER_ID: fake.worker_id,
            pr.HEADER_ATTEMPT: attempt,
            lv.HEADER_HEARTBEAT: 0.1,
            names.HEADER_DECLINED: True,
        },
    )


def _reply(fake: FakeWorker, message: Any, state: str, attempt: int, **data: Any) -> None:
    fake.proxy.publish(
        pr.Response(state, **data),
        message.properties["reply_to"],
        correlation_id=message.properties["correlation_id"],
        headers={
            pr.HEADER_WORKER_ID: fake.worker_id,
            pr.HEADER_ATTEMPT: attempt,
            lv.HEADER_HEARTBEAT: 0.1,
        },
    )


def test_declined_request_nobody_holds_is_sent_again():
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO]) as fake,
        running_executor(
            exchange, ["t"], policy=RequestPolicy(lost_after=LOST_AFTER_S)
        ) as executor,
    ):
        assert executor.wait_for_workers(1, WAIT_S) == 0
        fut = executor.execute_task(et.Echo("e"), "u-1", {"value": 1})
        assert fake.wait_requests(1)
        first = fake.requests[0][1]
        # The request carries the engine's loss bound for its worker's fence
        assert first.headers[lv.HEADER_HEARTBEAT_MISSES] == lv.HEARTBEAT_MISSES
        assert first.headers[lv.HEADER_LOST_AFTER] == LOST_AFTER_S
        # When a worker hands it back unrun and nobody says it holds it
        _decline(fake, first)
        # Then, a loss bound later, it is sent again as attempt 1, and completes
        assert fake.wait_requests(2)
        again = fake.requests[1][1]
        assert again.headers[pr.HEADER_ATTEMPT] == 1
        _reply(fake, again, pr.SUCCESS, 1, result=2)
        assert fut.result(WAIT_S) == (base.EXECUTED, 2)
        assert list(executor.lost_history) == []  # no worker was lost


def test_declined_request_a_live_worker_holds_is_left_to_it():
    exchange = unique()
    cond = threading.Condition()
    with (
        FakeWorker(exchange, "t", [ECHO], cond=cond) as holder,
        FakeWorker(exchange, "t2", [ECHO], cond=cond) as other,
        running_executor(exchange, ["t"], policy=RequestPolicy(lost_after=5.0)) as executor,
    ):
        assert executor.wait_for_workers(1, WAIT_S) == 0
        fut = executor.execute_task(et.Echo("e"), "u-2", {"value": 1})
        assert holder.wait_requests(1)
        message = holder.requests[0][1]
        # Given the first taker running it
        _reply(holder, message, pr.RUNNING, 0)
        # When another worker hands back a redelivery of it
        _decline(other, message)
        # Then the engine leaves it to the holder, whose outcome completes it
        _reply(holder, message, pr.SUCCESS, 0, result=3)
        assert fut.result(WAIT_S) == (base.EXECUTED, 3)
        assert len(holder.requests) == 1 and other.requests == []


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_declined_request_with_an_outcome_already_in_is_not_sent_again():
    exchange = unique()
    with (
        FakeWorker(exchange, "t", [ECHO]) as fake,
        running_executor(
            exchange, ["t"], policy=RequestPolicy(lost_after=LOST_AFTER_S)
        ) as executor,
    ):
        assert executor.wait_for_workers(1, WAIT_S) == 0
        fut = executor.execute_task(et.Echo("e"), "u-3", {"value": 1})
        assert fake.wait_requests(1)
        message = fake.requests[0][1]
        _reply(fake, message, pr.SUCCESS, 0, result=4)
        assert fut.result(WAIT_S) == (base.EXECUTED, 4)
        # When the broker redelivers it after a crash and a worker hands it back
        _decline(fake, message)
        # Then nothing is sent again (a later request still gets through first)
        later = executor.execute_task(et.Echo("e2"), "u-4", {"value": 5})
        assert fake.wait_requests(2)
        assert fake.requests[1][1].properties["correlation_id"] == "u-4"
        _reply(fake, fake.requests[1][1], pr.SUCCESS, 0, result=6)
        assert later.result(WAIT_S) == (base.EXECUTED, 6)
        assert not fake.wait_requests(3, timeout=3 * LOST_AFTER_S)
