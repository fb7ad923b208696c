"""Serving the dashboard (a process, or a server thread) and talking HTTP to it."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from tests.ops.helpers import ROOT, WAIT_S, broker_args, env

#: A token as `openssl rand -hex 24` makes one.
TOKEN = "9f2c4e1a7b3d5f60818a2b3c4d5e6f708192a3b4c5d6e7f8"


def start_dashboard(
    url: str, exchange: str, *extra: str, environ: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """A ``flowengine dashboard`` process on a free port, and the address it said."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowengine",
            "dashboard",
            *broker_args(url, exchange),
            "--port",
            "0",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=environ or env(),
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


def stop_dashboard(proc: subprocess.Popen[str]) -> str:
    """Stop it; what it wrote on stderr after its address."""
    proc.terminate()
    try:
        _out, err = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
    return err or ""


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve the ASGI ``app`` on a free loopback port in a thread; yields its address."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
        )
    )
    thread = threading.Thread(target=server.run, daemon=True, name="test-dashboard")
    thread.start()
    started = threading.Event()
    try:
        for _ in range(int(WAIT_S / 0.02)):
            if server.started or not thread.is_alive():
                break
            started.wait(0.02)
        assert server.started, "the dashboard server did not start"
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(WAIT_S)


def http(
    method: str, url: str, headers: dict[str, str] | None = None, body: Any = None
) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON body or text) of one request."""
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            status, got, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        status, got, raw = e.code, dict(e.headers), e.read()
    try:
        return status, got, json.loads(raw)
    except ValueError:
        return status, got, raw.decode(errors="replace")


def action_headers(token: str | None = TOKEN) -> dict[str, str]:
    """What the page's script sends with an action."""
    headers = {"Content-Type": "application/json", "X-Flowengine-Dashboard": "1"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers
