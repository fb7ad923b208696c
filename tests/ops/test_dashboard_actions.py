"""Actions from the dashboard, in a real headless Chromium, on real workers over Redis.

The dashboard runs with a token (and the workers' signing key) or a
basic-auth user: a wrong token is refused and changes nothing; the right
credentials cancel a running request, retry the flow it failed, requeue a
dead letter and shut a worker down warmly, each through the CLI's own code
paths. Without credentials the page shows no action and accepts none. The flow page's
timeline and the history's filters are read from the same runs.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.parse

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from flowengine.dashboard import auth  # noqa: E402
from flowengine.engines.worker_based.messaging import inventory  # noqa: E402
from flowengine.engines.worker_based.messaging.settings import BrokerSettings  # noqa: E402
from flowengine.jobs import backends as boards  # noqa: E402
from tests.jobs.boards import Boards  # noqa: E402
from tests.ops.dashboard_helpers import TOKEN, action_headers, start_dashboard, stop_dashboard  # noqa: E402
from tests.ops.helpers import (  # noqa: E402
    ROOT,
    WAIT_S,
    broker_args,
    env,
    flowengine,
    inspect_json,
    wait_until,
    worker_process,
)

pytestmark = pytest.mark.broker

#: Playwright timeouts are in milliseconds.
WAIT_MS = int(WAIT_S * 1000)

#: The signing key the workers, the engine and the dashboard share.
SIGNING_KEY = "0123456789abcdef0123456789abcdef"


def _open(browser, address: str, user: tuple[str, str] | None = None):
    credentials = {"username": user[0], "password": user[1]} if user else None
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, http_credentials=credentials)
    page.on("dialog", lambda dialog: dialog.accept())  # the confirmations
    page.goto(address)
    return page


def _sign_in(page, token: str) -> None:
    page.wait_for_selector("#login:not([hidden])", timeout=WAIT_MS)
    page.fill("#token", token)
    page.click("#login button")


def _action_result(page, action: str) -> str:
    shown = page.wait_for_selector(f"#action-result[data-action='{action}']", timeout=WAIT_MS)
    return shown.inner_text()


def test_token_holder_cancels_retries_and_shuts_down_a_signed_worker(
    redis_url, exchange, tmp_path, browser
):
    keys = tmp_path / "keys"
    keys.write_text(SIGNING_KEY + "\n")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    backend = f"dir:{tmp_path}/store"
    signed = env(FLOWENGINE_SECRET_FILE=str(keys))
    with worker_process(redis_url, exchange, "--secret-file", str(keys)) as worker:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowengine",
                "run",
                "tests.ops.ops_flows:waits_for_cancel",
                "--engine",
                "worker-based",
                *broker_args(redis_url, exchange),
                "--topic",
                "ops",
                "--backend",
                backend,
                "--book",
                "ops",
                "--no-progress",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=signed,
            cwd=ROOT,
        )
        wait_until(lambda: (tmp_path / "store").is_dir(), "the run's backend folder")
        dashboard, address = start_dashboard(
            redis_url,
            exchange,
            "--backend",
            backend,
            "--token-file",
            str(token_file),
            "--secret-file",
            str(keys),
        )
        page = _open(browser, address)
        log = ""
        try:
            # Given a page that asks for the token, and a wrong one
            _sign_in(page, "wrong-token-0123456789")
            page.wait_for_selector("#login-error:has-text('wrong token')", timeout=WAIT_MS)
            # a wrong token's action gets 401 and changes nothing
            refused = page.request.post(
                address + "api/actions/cancel",
                headers=action_headers("wrong-token-0123456789"),
                data={"request": "*"},
            )
            assert refused.status == 401
            # When the right token is given
            _sign_in(page, TOKEN)
            request = page.wait_for_selector("#requests tbody tr[data-uuid]", timeout=WAIT_MS)
            first = request.get_attribute("data-uuid")
            assert "running" in request.inner_text()  # untouched by the wrong token
            assert page.is_visible("#mode:has-text('actions allowed')")
            # A flow its engine still runs is not resumed (the CLI's own check)
            page.wait_for_selector("#flows tbody tr:has-text('RUNNING')", timeout=WAIT_MS)
            flow = page.get_attribute("#flows tbody tr", "data-flow")
            refused = page.request.post(
                address + "api/actions/resume", headers=action_headers(), data={"flow": flow}
            )
            assert refused.status == 409 and "still alive" in refused.json()["error"]
            # Then its cancel button cancels it on the worker (signed like the CLI's)
            page.click(f"#requests tr[data-uuid='{first}'] button.action-cancel")
            assert "cancelled on worker" in _action_result(page, "cancel")
            page.wait_for_selector("#flows tbody tr:has-text('REVERTED')", timeout=WAIT_MS)
            assert run.wait(WAIT_S) == 1
            # And the flow page has a timeline: queued, started, ended, worker, attempt
            page.click("#flows tbody tr")
            page.wait_for_selector("#timeline .lane[data-atom='wait'] .bar.ran", timeout=WAIT_MS)
            events = page.eval_on_selector_all(
                "#history tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.innerText))"
            )
            assert [e[3] for e in events] == ["queued", "started", "FAILURE"]
            worker_id = events[-1][4]
            assert f":{worker.pid}:" in worker_id and events[-1][5] == "1"
            page.wait_for_selector("#no-requests:not([hidden])", timeout=WAIT_MS)
            # When the failed flow is retried from its page
            page.click("#flow-actions button.action-retry")
            assert "started" in _action_result(page, "retry")
            # Then it runs again on the worker (its atom, so its request, keeps its
            # uuid), and is cancelled in turn
            page.wait_for_selector("#flows tbody tr:has-text('RUNNING')", timeout=WAIT_MS)
            page.click(f"#requests tr[data-uuid='{first}'] button.action-cancel")
            page.wait_for_selector("#flows tbody tr:has-text('REVERTED')", timeout=WAIT_MS)
            # When the worker is shut down from its row
            page.click(f"#workers tr[data-worker-id='{worker_id}'] button.action-shutdown")
            assert "warm shutdown started" in _action_result(page, "shutdown")
            # Then it exits by itself, cleanly
            assert worker.wait(WAIT_S) == 0
            page.wait_for_selector("#no-workers:not([hidden])", timeout=WAIT_MS)
        finally:
            page.close()
            log = stop_dashboard(dashboard)
            if run.poll() is None:
                run.kill()
                run.wait()
    # Each action is logged with who did what
    who = f"by token {auth.token_id(TOKEN)} from 127.0.0.1"
    assert f"Dashboard action cancel (request={first}) {who}" in log
    assert f"Dashboard action shutdown (worker={worker_id}) {who}" in log
    assert "Dashboard action retry" in log and "exited with status 1" in log
    assert TOKEN not in log


def _filtered(page, **filters: str) -> list[str]:
    """States of the flows the history lists once ``filters`` are entered."""
    page.click("#filter-clear")
    for key, value in filters.items():
        if key == "state":
            page.select_option("#filter-state", value)
        else:
            page.fill(f"#filter-{key}", value)
            page.dispatch_event(f"#filter-{key}", "change")
    expected = urllib.parse.urlencode(
        [
            (k, filters[k] + ("Z" if k in ("since", "until") else ""))
            for k in ("state", "name", "worker", "since", "until")
            if k in filters
        ]
    )
    # The list the page shows once the answer to exactly this filter came
    page.wait_for_function(
        "q => document.querySelector('#flows-count').dataset.query === q",
        arg=expected,
        timeout=WAIT_MS,
    )
    states: list[str] = page.eval_on_selector_all(
        "#flows tbody tr", "rows => rows.map(r => r.cells[3].innerText)"
    )
    return sorted(states)


def test_history_filters_and_a_dead_letter_requeued_from_the_page(
    redis_url, exchange, tmp_path, browser
):
    users = tmp_path / "users"
    users.write_text("ops:correct horse battery\n")
    backend = f"dir:{tmp_path}/store"
    broker = BrokerSettings(redis_url)
    dead, topic_queue = f"{exchange}_ops.dead", f"{exchange}_ops"
    run = [
        "run",
        "tests.ops.ops_flows:quick",
        "--engine",
        "worker-based",
        *broker_args(redis_url, exchange),
        "--topic",
        "ops",
        "--backend",
        backend,
        "--no-progress",
    ]
    with worker_process(redis_url, exchange, "--max-body-bytes", "2000") as worker:
        # Given a flow that succeeded, and one whose request was too big: refused
        # by the worker, dead-lettered, the flow failed
        assert flowengine(*run, "--book", "small", "--store", "value=7").returncode == 0
        assert flowengine(*run, "--book", "big", "--store", "value=" + "x" * 3000).returncode == 1
        wait_until(
            lambda: inventory.queue_depth(broker, exchange, dead) == 1,
            "the big request in the dead letters",
        )
        # and a jobboard with a job waiting and one trashed
        board_url = Boards("redis", redis_url).url
        with boards.backend("flowengine", {"board": board_url}) as board:
            board.post("nightly-report")
            trashed = board.post("order-8")
            board.claim(trashed, "cli")
            board.trash(trashed, "cli", reason="posted twice")
        # (signed in as a basic-auth user: the browser answers the page's challenge)
        dashboard, address = start_dashboard(
            redis_url,
            exchange,
            "--backend",
            backend,
            "--board",
            board_url,
            "--basic-auth-file",
            str(users),
        )
        page = _open(browser, address, ("ops", "correct horse battery"))
        page.wait_for_selector(f"#dead-letters tr[data-queue='{dead}']", timeout=WAIT_MS)
        # When the history is filtered, each filter lists the right flows
        assert _filtered(page) == ["REVERTED", "SUCCESS"]
        assert _filtered(page, state="SUCCESS") == ["SUCCESS"]
        assert _filtered(page, state="REVERTED") == ["REVERTED"]
        assert _filtered(page, state="FAILURE") == []
        assert _filtered(page, name="quick") == ["REVERTED", "SUCCESS"]
        assert _filtered(page, name="nothing-like-it") == []
        # (the big request never ran on the worker: only the small one names it)
        assert _filtered(page, worker=f":{worker.pid}:") == ["SUCCESS"]
        # (seconds not 0: a time input drops ':00' seconds from its value)
        assert _filtered(page, since="2000-01-01T00:00:01", until="2000-01-02T00:00:01") == []
        assert _filtered(page, since="2000-01-01T00:00:01") == ["REVERTED", "SUCCESS"]
        assert _filtered(page, state="SUCCESS", name="quick") == ["SUCCESS"]
        # and the board's jobs, by their own state and the same name filter
        page.click("#filter-clear")
        page.select_option("#jobs-state", "TRASHED")
        page.wait_for_function(
            "() => document.querySelector('#jobs-count').dataset.query === 'state=TRASHED'",
            timeout=WAIT_MS,
        )
        assert page.inner_text("#jobs tbody").split("\t")[1:3] == ["order-8", "TRASHED"]
        page.select_option("#jobs-state", "")
        page.fill("#filter-name", "nightly")
        page.dispatch_event("#filter-name", "change")
        page.wait_for_function(
            "() => document.querySelector('#jobs-count').dataset.query === 'name=nightly'",
            timeout=WAIT_MS,
        )
        assert "UNCLAIMED" in page.inner_text("#jobs tbody")
        assert page.inner_text("#jobs-count") == "1 job(s)"
    # (the worker is gone: a requeued request waits in its queue)
    try:
        # When the dead letter is requeued from the page
        page.click(f"#dead-letters tr[data-queue='{dead}'] button.action-requeue")
        assert "Requeued dead letter 1" in _action_result(page, "requeue")
        # Then it left the dead letters for the queue it was first published to
        assert inventory.queue_depth(broker, exchange, dead) == 0
        assert inventory.queue_depth(broker, exchange, topic_queue) == 1
    finally:
        page.close()
        log = stop_dashboard(dashboard)
    assert (
        f"Dashboard action requeue (queue={dead}, index=1) by user ops from 127.0.0.1:"
        f" Requeued dead letter 1"
    ) in log


def test_the_read_only_page_shows_no_action_and_accepts_none(redis_url, exchange, browser):
    with worker_process(redis_url, exchange):
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowengine",
                "run",
                "tests.ops.ops_flows:waits_for_cancel",
                "--engine",
                "worker-based",
                *broker_args(redis_url, exchange),
                "--topic",
                "ops",
                "--no-progress",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env(),
            cwd=ROOT,
        )
        dashboard, address = start_dashboard(redis_url, exchange)
        page = _open(browser, address)
        try:
            request = page.wait_for_selector("#requests tbody tr[data-uuid]", timeout=WAIT_MS)
            uuid = request.get_attribute("data-uuid")
            assert page.is_visible("#mode:has-text('read-only')")
            assert page.query_selector_all("button.action") == []
            assert not page.is_visible("#requests th.action-col")
            refused = page.request.post(
                address + "api/actions/cancel", headers=action_headers(None), data={"request": uuid}
            )
            assert refused.status == 403
            # The request still runs
            [answer] = inspect_json(redis_url, exchange, "active")
            assert [r["uuid"] for r in answer["result"]["requests"]] == [uuid]
        finally:
            page.close()
            stop_dashboard(dashboard)
            assert (
                flowengine("control", "cancel", uuid, *broker_args(redis_url, exchange)).returncode
                == 0
            )
            run.wait(WAIT_S)
