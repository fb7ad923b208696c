"""Fixtures of the operations tests: a real broker (Redis and RabbitMQ) and an exchange."""

from __future__ import annotations

import uuid

import pytest

#: The brokers every command is tested against (real servers, see tests/conftest.py).
REAL_BROKERS = [
    pytest.param("redis", marks=pytest.mark.broker),
    pytest.param("amqp", marks=pytest.mark.broker),
]


@pytest.fixture(params=REAL_BROKERS)
def real_broker(request: pytest.FixtureRequest) -> str:
    """The URL of a Redis or RabbitMQ server of this session."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def exchange() -> str:
    """A fresh exchange name."""
    return f"ops-{uuid.uuid4().hex[:10]}"


#: Debian's Chromium (apt-get install chromium): Playwright drives it, never a
#: browser of its own download.
CHROMIUM = "/usr/bin/chromium"

#: Flags of a headless Chromium that talks to nothing but the page under test.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium driven by Playwright (skipped locally without them; fails in CI)."""
    import os

    from tests.conftest import _unavailable

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright)")
    if not os.path.exists(CHROMIUM):
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
