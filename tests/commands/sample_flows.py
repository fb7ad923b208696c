"""Flow factories the command tests name as module:factory."""

from __future__ import annotations

from flowengine import retry, task
from flowengine.patterns import graph_flow, linear_flow, unordered_flow
from tests.worker_based.event_tasks import Step


class Noop(task.Task):
    """Does nothing."""

    def execute(self) -> None:
        return None


def steps(count: int = 3) -> linear_flow.Flow:
    """v0 -> v1 -> ... -> v<count>, one Step each."""
    flow = linear_flow.Flow("steps")
    for i in range(count):
        flow.add(Step(f"step-{i}", rebind={"value": f"v{i}"}, provides=f"v{i + 1}"))
    return flow


def nested() -> linear_flow.Flow:
    """Three levels of flows, a retry controller and a graph flow."""
    fan = unordered_flow.Flow("fan").add(Noop("left"), Noop("right"))
    guarded = graph_flow.Flow("guarded", retry=retry.Times(2, name="again")).add(Noop("inner"), fan)
    return linear_flow.Flow("outer").add(Noop("first"), guarded, Noop("last"))
