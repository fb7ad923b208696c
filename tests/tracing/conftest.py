"""Fixtures of the tracing tests."""

from __future__ import annotations

import pytest

from flowengine import tracing


@pytest.fixture(autouse=True)
def _tracing_not_switched_off(monkeypatch):
    """A FLOWENGINE_TRACING=off in the developer's environment must not change the tests."""
    monkeypatch.delenv(tracing.ENV_SWITCH, raising=False)
