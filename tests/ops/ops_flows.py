"""Flows the operations tests run with ``flowengine run`` (importable by name)."""

from __future__ import annotations

from flowengine.patterns import linear_flow
from tests.ops import ops_tasks


def waits_for_cancel() -> linear_flow.Flow:
    """One task that runs until its request is cancelled."""
    return linear_flow.Flow("waits").add(ops_tasks.WaitForCancel("wait"))


def quick() -> linear_flow.Flow:
    """One task that returns its ``value`` at once."""
    return linear_flow.Flow("quick").add(ops_tasks.Quick("quick"))
