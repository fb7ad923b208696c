"""The dashboard in a real headless Chromium, against real workers (Redis and RabbitMQ)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.ops.helpers import ROOT, WAIT_S, broker_args, env, flowengine, wait_until, worker_process

# Out of the fast tier (tests/fast_tier.py): runs Python processes (and a browser).
pytestmark = pytest.mark.broker

#: Playwright timeouts are in milliseconds.
WAIT_MS = int(WAIT_S * 1000)


def _start_dashboard(url: str, exchange: str, backend: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowengine",
            "dashboard",
            *broker_args(url, exchange),
            "--backend",
            backend,
            "--port",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:
        found = re.search(r"on (http://\S+/)", line)
        if found:
            return proc, found.group(1)
        said.append(line)
    raise AssertionError(
        f"the dashboard never said where it listens (exit {proc.wait()}): {''.join(said)[-2000:]}"
    )


def test_the_page_shows_workers_a_running_flow_and_its_failure(
    real_broker, exchange, tmp_path, browser
):
    backend = f"dir:{tmp_path}/store"
    with worker_process(real_broker, exchange) as worker:
        # Given a flow persisted in the backend, running on the worker
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowengine",
                "run",
                "tests.ops.ops_flows:waits_for_cancel",
                "--engine",
                "worker-based",
                *broker_args(real_broker, exchange),
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
            env=env(),
            cwd=ROOT,
        )
        # (the dashboard refuses a backend folder that does not exist yet:
        # wait until the run has made it)
        wait_until(lambda: (tmp_path / "store").is_dir(), "the run's backend folder")
        dashboard, address = _start_dashboard(real_broker, exchange, backend)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        refused: list[str] = []
        page.on("response", lambda r: r.status >= 400 and refused.append(f"{r.status} {r.url}"))
        try:
            # When the dashboard is opened
            page.goto(address)
            # Then the worker is listed, with the request it runs
            row = page.wait_for_selector("#workers tbody tr[data-worker-id]", timeout=WAIT_MS)
            assert f":{worker.pid}" in row.inner_text()
            request = page.wait_for_selector("#requests tbody tr[data-uuid]", timeout=WAIT_MS)
            assert "wait" in request.inner_text() and "running" in request.inner_text()
            uuid = request.get_attribute("data-uuid")
            # And the persisted flow, RUNNING; a click shows its graph coloured by state
            page.wait_for_selector("#flows tbody tr:has-text('RUNNING')", timeout=WAIT_MS)
            page.click("#flows tbody tr")
            page.wait_for_selector(
                "#atoms tbody tr[data-atom='wait']:has-text('RUNNING')", timeout=WAIT_MS
            )
            page.wait_for_function(
                "document.querySelector('#graph').naturalWidth > 0", timeout=WAIT_MS
            )
            # When the request is cancelled (the flow fails and reverts)
            assert (
                flowengine(
                    "control", "cancel", uuid, *broker_args(real_broker, exchange)
                ).returncode
                == 0
            )
            # Then the page updates by itself: no request held, the flow REVERTED,
            # the worker's cancelled count, and the failure's traceback one click away
            page.wait_for_selector("#no-requests:not([hidden])", timeout=WAIT_MS)
            page.wait_for_selector("#flows tbody tr:has-text('REVERTED')", timeout=WAIT_MS)
            page.wait_for_selector(
                "#atoms tbody tr[data-atom='wait']:has-text('REVERTED')", timeout=WAIT_MS
            )
            assert "RequestCancelled" in page.inner_text("#atoms tbody tr[data-atom='wait']")
            # with where it ran and for how long (the worker's id, as `inspect` names it)
            cells = page.query_selector_all("#atoms tbody tr[data-atom='wait'] td")
            assert cells[4].inner_text().endswith(" s")
            assert f":{worker.pid}:" in cells[5].inner_text()
            assert not page.is_visible("pre.traceback")
            page.click("button.traceback-toggle")
            assert page.is_visible("pre.traceback")
            assert "raise_if_cancelled" in page.inner_text("pre.traceback")
            # naming the worker whose frames it shows
            assert page.inner_text("pre.traceback").startswith("Raised on worker ")
            assert f":{worker.pid}:" in page.inner_text("pre.traceback").splitlines()[0]
            page.wait_for_selector(
                "#workers tbody tr td:nth-child(9):has-text('1')", timeout=WAIT_MS
            )
            assert run.wait(WAIT_S) == 1  # the flow failed
            # And nothing the page or the browser asked for was refused (no favicon 404)
            assert page.request.get(address + "favicon.ico").status == 200
            assert refused == []
        finally:
            page.close()
            dashboard.terminate()
            dashboard.wait(WAIT_S)
            if run.poll() is None:
                run.kill()
                run.wait()


@pytest.mark.parametrize("hidden", ["starlette", "uvicorn"])
def test_the_dashboard_without_its_extra_names_the_install_command(hidden):
    code = (
        f"import sys; sys.modules[{hidden!r}] = None\n"
        "from flowengine import cli\n"
        "sys.exit(cli.main(['dashboard', '--url', 'redis://127.0.0.1:1/0']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT_S, cwd=ROOT
    )
    assert proc.returncode == 2
    assert "pip install 'flowengine[dashboard]'" in proc.stderr
