"""Headers.parse: every header read once, checked, never raising."""

from __future__ import annotations

import pytest

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.wire import liveness as lv
from flowengine.engines.worker_based.wire.headers import Headers


def test_a_flowengine_request_is_read_whole():
    headers = Headers.parse(
        {
            pr.HEADER_ATTEMPT: 2,
            pr.HEADER_ORIGIN: "h:1",
            lv.HEADER_REQUEST_ID: "sub-1",
            pr.HEADER_EXPIRES: 100.5,
            pr.HEADER_TIMELIMIT: [1, 2],
            pr.HEADER_ROOT_ID: "flow",
            pr.HEADER_PARENT_ID: "detail",
        }
    )
    assert headers == Headers(
        attempt=2,
        origin="h:1",
        request_id="sub-1",
        expires=100.5,
        timelimit=[1, 2],
        root_id="flow",
        parent_id="detail",
    )
    assert headers.from_flowengine_engine and not headers.problems


def test_a_taskflow_message_has_none_of_them():
    for raw in (None, {}):
        headers = Headers.parse(raw)
        assert headers == Headers()
        assert not headers.from_flowengine_engine and not headers.from_flowengine_worker


@pytest.mark.parametrize(
    "raw",
    [
        {pr.HEADER_ATTEMPT: True},
        {pr.HEADER_ATTEMPT: -1},
        {pr.HEADER_ATTEMPT: "1"},
        {lv.HEADER_HEARTBEAT: 0},
        {lv.HEADER_HEARTBEAT: "x"},
        {pr.HEADER_ORIGIN: 5},
        {lv.HEADER_REQUEST_ID: ""},
    ],
)
def test_unusable_values_read_as_absent(raw):
    assert Headers.parse(raw) == Headers()


def test_a_worker_reply_names_its_worker_and_heartbeat():
    headers = Headers.parse(
        {pr.HEADER_WORKER_ID: 7, lv.HEADER_HEARTBEAT: 0.5, pr.HEADER_LEAVING: True}
    )
    assert (headers.worker_id, headers.heartbeat_s, headers.leaving) == ("7", 0.5, True)
    assert headers.from_flowengine_worker


def test_a_malformed_expires_is_named_not_raised():
    headers = Headers.parse({pr.HEADER_EXPIRES: "next tuesday"})
    assert headers.expires is None
    assert len(headers.problems) == 1 and "next tuesday" in headers.problems[0]
    assert Headers.parse({pr.HEADER_EXPIRES: "2030-01-01T00:00:00+00:00"}).expires == (1893456000.0)
