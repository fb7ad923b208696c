"""The demo's graph flow: N sources -> square -> total, reduced pairwise to a report."""

from __future__ import annotations

from flowengine.demo import tasks
from flowengine.patterns import graph_flow

# Sources in the default demo: 8 sources give 8 * 3 + 7 + 1 = 32 tasks,
# enough to keep a few workers busy and show parallel branches.
DEFAULT_SOURCES = 8


def make_flow(sources: int = DEFAULT_SOURCES) -> graph_flow.Flow:
    """Build the demo flow; edges are inferred from what each task provides/requires."""
    if sources < 1:
        raise ValueError("The demo needs at least one source")
    flow = graph_flow.Flow("demo-sum-of-squares")
    level: list[str] = []
    for i in range(sources):
        flow.add(
            tasks.Generate(f"generate-{i}", provides=f"data_{i}", inject={"seed": i}),
            tasks.Square(f"square-{i}", provides=f"squares_{i}", rebind={"values": f"data_{i}"}),
            tasks.Total(f"total-{i}", provides=f"total_{i}", rebind={"values": f"squares_{i}"}),
        )
        level.append(f"total_{i}")
    depth = 0
    while len(level) > 1:
        depth += 1
        nxt: list[str] = []
        for j in range(0, len(level) - 1, 2):
            symbol = f"sum_{depth}_{j // 2}"
            flow.add(
                tasks.Combine(
                    f"combine-{depth}-{j // 2}",
                    provides=symbol,
                    rebind={"left": level[j], "right": level[j + 1]},
                )
            )
            nxt.append(symbol)
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    flow.add(
        tasks.Report(
            "report", provides="report", rebind={"total": level[0]}, inject={"sources": sources}
        )
    )
    return flow


def expected_total(sources: int = DEFAULT_SOURCES) -> int:
    """The grand total the flow must compute (to check the run)."""
    return sum((i * 10 + k) ** 2 for i in range(sources) for k in range(5))


def task_count(sources: int = DEFAULT_SOURCES) -> int:
    """How many tasks make_flow(sources) holds."""
    return 3 * sources + (sources - 1) + 1
