"""The dashboard's history: which persisted flows each filter lists (a real directory backend)."""

from __future__ import annotations

import contextlib
import uuid

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from flowengine.dashboard.flows import FlowsSource  # noqa: E402
from flowengine.dashboard.history import BadFilter, HistoryFilter  # noqa: E402
from flowengine.persistence import backends, models, run_records  # noqa: E402


def _flow(
    name: str, state: str, created: str | None, updated: str | None, workers: tuple[str, ...] = ()
) -> models.FlowDetail:
    fd = models.FlowDetail(name, uuid.uuid4().hex)
    fd.state = state
    records: dict = {
        "atom_runs": {f"a{i}": {"worker": w, "state": "SUCCESS"} for i, w in enumerate(workers)}
    }
    if created is not None:
        records.update(created_at=created, updated_at=updated)
    fd.meta = {run_records.META_KEY: records}
    return fd


@pytest.fixture
def source(tmp_path) -> FlowsSource:
    backend = backends.fetch({"connection": "dir", "path": str(tmp_path / "store")})
    book = models.LogBook("orders")
    for fd in (
        _flow(
            "order-1",
            "SUCCESS",
            "2026-11-29T08:00:00+00:00",
            "2026-11-29T08:00:05+00:00",
            ("host:1:a",),
        ),
        _flow(
            "order-2",
            "REVERTED",
            "2026-11-29T09:00:00+00:00",
            "2026-11-29T09:00:03+00:00",
            ("host:1:a", "host:2:b"),
        ),
        _flow(
            "refund-1",
            "FAILURE",
            "2026-11-29T10:00:00+00:00",
            "2026-11-29T10:30:00+00:00",
            ("host:2:b",),
        ),
        _flow("legacy", "SUCCESS", None, None),
    ):
        book.add(fd)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
        conn.save_logbook(book)
    return FlowsSource(f"dir:{tmp_path}/store")


def _names(source: FlowsSource, states=(), **query) -> list[str]:
    return sorted(row["name"] for row in source.list(HistoryFilter.from_query(query, states)))


def test_each_filter_lists_the_flows_it_names(source):
    assert _names(source) == ["legacy", "order-1", "order-2", "refund-1"]
    assert _names(source, ["SUCCESS"]) == ["legacy", "order-1"]
    assert _names(source, ["reverted", "FAILURE"]) == ["order-2", "refund-1"]
    assert _names(source, name="ORDER") == ["order-1", "order-2"]
    assert _names(source, worker="host:2") == ["order-2", "refund-1"]
    # Active in the range: updated after its start, created before its end
    assert _names(source, since="2026-11-29T08:30:00Z") == ["order-2", "refund-1"]
    assert _names(source, until="2026-11-29T09:00:00Z") == ["order-1", "order-2"]
    assert _names(source, since="2026-11-29T10:15:00", until="2026-11-29T11:00:00") == [
        "refund-1"
    ]  # a time without a zone is UTC; a flow still running in it counts
    assert _names(source, ["SUCCESS"], name="order", worker="host:1") == ["order-1"]
    # Rows name the workers the filter matched on
    [row] = source.list(HistoryFilter(name="order-2"))
    assert row["workers"] == ["host:1:a", "host:2:b"] and row["book"] == "orders"


@pytest.mark.parametrize(
    "states, query, why",
    [
        (["DONE"], {}, "state=DONE: not a flow state"),
        ([], {"since": "yesterday"}, "since=yesterday: not an ISO 8601 time"),
    ],
)
def test_a_filter_that_cannot_be_read_says_why(states, query, why):
    with pytest.raises(BadFilter, match=why):
        HistoryFilter.from_query(query, states)


@pytest.mark.broker
def test_jobs_a_redis_board_lists_are_filtered_like_flows(redis_url):
    from flowengine.dashboard import app as app_mod
    from flowengine.dashboard.jobs import JobsSource
    from flowengine.dashboard.live import LiveState
    from flowengine.engines.worker_based.messaging.settings import BrokerSettings
    from flowengine.jobs import backends as boards
    from tests.jobs.boards import Boards
    from tests.ops.dashboard_helpers import http, serving

    url = Boards("redis", redis_url).url
    # Given a board with two jobs waiting, one claimed, one trashed, one finished
    with boards.backend("flowengine", {"board": url}) as board:
        waiting = board.post("nightly-report")
        claimed = board.post("order-7")
        board.claim(claimed, "conductor-a")
        trashed = board.post("order-8")
        board.claim(trashed, "cli")
        board.trash(trashed, "cli", reason="posted twice")
        finished = board.post("order-9")
        board.claim(finished, "conductor-b")
        board.consume(finished, "conductor-b", outcome="reverted", reason="card declined")
    live = LiveState("nowhere", BrokerSettings(redis_url), events=False)
    with serving(app_mod.build_app(live, None, jobs=JobsSource(url))) as address:

        def listed(query: str = "") -> list[tuple[str, str]]:
            status, _, rows = http("GET", address + "api/jobs" + query)
            assert status == 200, rows
            return sorted((row["name"], row["state"]) for row in rows)

        # When the page filters them, each filter lists the right jobs
        assert listed() == [
            ("nightly-report", "UNCLAIMED"),
            ("order-7", "CLAIMED"),
            ("order-8", "TRASHED"),
            ("order-9", "REVERTED"),
        ]
        assert listed("?state=TRASHED") == [("order-8", "TRASHED")]
        assert listed("?state=REVERTED&worker=conductor-b") == [("order-9", "REVERTED")]
        assert listed("?state=SUCCEEDED") == []
        assert listed("?name=order&state=CLAIMED") == [("order-7", "CLAIMED")]
        assert listed("?worker=conductor-a") == [("order-7", "CLAIMED")]
        assert listed("?since=2000-01-01T00:00:00Z&until=2000-01-02T00:00:00Z") == []
        assert len(listed("?since=2000-01-01T00:00:00Z")) == 4
        status, _, body = http("GET", address + "api/jobs?state=SUCCESS")
        assert status == 400 and "not a job state" in body["error"]
    assert len({waiting.uuid, claimed.uuid, trashed.uuid, finished.uuid}) == 4
