"""Who may read the dashboard and act from it: plain HTTP against a real server.

The application is served by uvicorn in a thread over a live state that is
never started (these rules do not depend on the workers); the actions it
would run are recorded instead (their real effect on workers is tested in
the browser, test_dashboard_actions.py).
"""

from __future__ import annotations

import base64
import subprocess
import sys

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from flowengine.dashboard import app as app_mod  # noqa: E402
from flowengine.dashboard import auth  # noqa: E402
from flowengine.dashboard.actions import Actions, Outcome  # noqa: E402
from flowengine.dashboard.live import LiveState  # noqa: E402
from flowengine.engines.worker_based.messaging.settings import BrokerSettings  # noqa: E402
from tests.ops.dashboard_helpers import TOKEN, action_headers, http, serving  # noqa: E402
from tests.ops.helpers import ROOT, WAIT_S, env  # noqa: E402


class RecordedActions(Actions):
    """Records the actions let through instead of doing them."""

    def __init__(self) -> None:
        super().__init__("nowhere", BrokerSettings("redis://127.0.0.1:1/0"))
        self.done: list[tuple[str, dict, str]] = []

    def run(self, name, fields, who):  # type: ignore[no-untyped-def]
        self.done.append((name, dict(fields), who))
        return Outcome(f"{name} done")


def _app(credentials: auth.Credentials, actions: Actions | None):
    live = LiveState("nowhere", BrokerSettings("redis://127.0.0.1:1/0"), events=False)
    return app_mod.build_app(live, None, credentials, actions)


def test_without_credentials_the_dashboard_is_read_only():
    actions = RecordedActions()
    with serving(_app(auth.Credentials(), actions)) as url:
        status, _, state = http("GET", url + "api/state")
        assert status == 200 and state["actions_enabled"] is False
        status, _, body = http(
            "POST", url + "api/actions/cancel", action_headers(None), {"request": "abc"}
        )
        assert status == 403 and "read-only" in body["error"]
    assert actions.done == []


def test_a_token_is_needed_for_data_and_actions_and_a_wrong_one_changes_nothing():
    actions = RecordedActions()
    with serving(_app(auth.Credentials(token=TOKEN), actions)) as url:
        # The page's shell holds no data: open, so it can ask for the token
        assert http("GET", url)[0] == 200
        assert http("GET", url + "static/app.js")[0] == 200
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token-0123456789"},
            {"Authorization": "Basic " + base64.b64encode(b"a:b").decode()},
        ):
            status, got, _ = http("GET", url + "api/state", headers)
            assert status == 401 and got["www-authenticate"].startswith("Bearer")
            assert http("GET", url + "api/flows", headers)[0] == 401
            assert (
                http(
                    "POST",
                    url + "api/actions/cancel",
                    dict(action_headers(None), **headers),
                    {"request": "abc"},
                )[0]
                == 401
            )
        assert actions.done == []
        status, _, state = http("GET", url + "api/state", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and state["actions_enabled"] is True
        status, _, body = http(
            "POST", url + "api/actions/cancel", action_headers(), {"request": "abc"}
        )
        assert status == 200 and body["message"] == "cancel done"
    [(name, fields, who)] = actions.done
    assert (name, fields) == ("cancel", {"request": "abc"})
    assert who == f"token {auth.token_id(TOKEN)} from 127.0.0.1" and TOKEN not in who


def test_an_action_must_come_from_the_page_itself():
    actions = RecordedActions()
    with serving(_app(auth.Credentials(token=TOKEN), actions)) as url:
        target = url + "api/actions/cancel"
        # Given the right token, but what a form or another site's page could send
        no_header = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        form = dict(action_headers(), **{"Content-Type": "application/x-www-form-urlencoded"})
        other_site = dict(action_headers(), Origin="http://evil.example")
        for headers in (no_header, form, other_site):
            status, _, body = http("POST", target, headers, {"request": "abc"})
            assert status == 403, (headers, body)
        # A GET never acts
        assert http("GET", target, {"Authorization": f"Bearer {TOKEN}"})[0] == 405
        # The page's own request, with its origin, does
        same = dict(action_headers(), Origin=url.rstrip("/"))
        assert http("POST", target, same, {"request": "abc"})[0] == 200
    assert [name for name, _, _ in actions.done] == ["cancel"]


def test_basic_auth_guards_the_page_itself_so_the_browser_prompts():
    credentials = auth.Credentials(users={"ops": "correct horse"})
    with serving(_app(credentials, RecordedActions())) as url:
        status, got, _ = http("GET", url)
        assert status == 401 and got["www-authenticate"].startswith("Basic")
        wrong = base64.b64encode(b"ops:wrong password").decode()
        assert http("GET", url, {"Authorization": f"Basic {wrong}"})[0] == 401
        right = base64.b64encode(b"ops:correct horse").decode()
        status, _, state = http("GET", url + "api/state", {"Authorization": f"Basic {right}"})
        assert status == 200 and state["actions_enabled"] is True


def test_credentials_come_from_files_or_the_environment_and_short_ones_are_refused(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(f"# the dashboard's token\n{TOKEN}\n")
    assert auth.load(str(token_file), None, environ={}).token == TOKEN
    assert auth.load(None, None, environ={auth.TOKEN_ENV: TOKEN}).token == TOKEN
    users = auth.load(None, None, environ={auth.BASIC_AUTH_ENV: "ops:correct horse"}).users
    assert dict(users) == {"ops": "correct horse"}
    assert not auth.load(None, None, environ={}).enabled
    with pytest.raises(auth.CredentialsError, match="at least 16"):
        auth.load(None, None, environ={auth.TOKEN_ENV: "short"})
    with pytest.raises(auth.CredentialsError, match="holds no credentials"):
        (tmp_path / "empty").write_text("\n")
        auth.load(str(tmp_path / "empty"), None, environ={})
    assert TOKEN not in repr(auth.load(str(token_file), None, environ={}))


def _dashboard(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowengine", "dashboard", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        cwd=ROOT,
        env=env(**extra_env),
    )


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_a_public_address_without_credentials_is_refused_in_one_line():
    proc = _dashboard("--url", "redis://127.0.0.1:1/0", "--host", "0.0.0.0")
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(
        "flowengine dashboard: refusing to serve on 0.0.0.0 without authentication"
    )
    assert "--insecure-public" in line and "--token-file" in line


def test_insecure_public_or_credentials_pass_the_check(redis_url, tmp_path):
    from tests.ops.dashboard_helpers import start_dashboard, stop_dashboard

    for extra, environ in ((["--insecure-public"], {}), ([], {auth.TOKEN_ENV: TOKEN})):
        proc, address = start_dashboard(
            redis_url, "auth-check", "--host", "0.0.0.0", *extra, environ=env(**environ)
        )
        try:
            assert address.startswith("http://0.0.0.0:")
        finally:
            stop_dashboard(proc)


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_a_token_too_short_or_a_missing_file_is_one_line(tmp_path):
    proc = _dashboard("--url", "redis://127.0.0.1:1/0", **{auth.TOKEN_ENV: "short"})
    assert proc.returncode == 2 and "at least 16" in proc.stderr
    proc = _dashboard("--url", "redis://127.0.0.1:1/0", "--token-file", str(tmp_path / "missing"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"flowengine dashboard: --token-file {tmp_path}/missing: No such file or directory"
    )
