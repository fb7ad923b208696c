"""The dashboard's flow graph: the atom whose execution failed stands out once reverted."""

from __future__ import annotations

import contextlib
import re

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from flowengine import engines, task  # noqa: E402
from flowengine.dashboard.flows import FlowsSource  # noqa: E402
from flowengine.engines.action_engine import graph_draw  # noqa: E402
from flowengine.patterns import linear_flow  # noqa: E402
from flowengine.persistence import backends, models  # noqa: E402


class Reserve(task.Task):
    def execute(self) -> None:
        pass

    def revert(self, **kwargs) -> None:
        pass


class Charge(task.Task):
    def execute(self) -> None:
        raise RuntimeError("card declined")


def _failed_run(tmp_path) -> tuple[FlowsSource, str]:
    backend = backends.fetch({"connection": "dir", "path": str(tmp_path / "store")})
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    book = models.LogBook("orders")
    flow = linear_flow.Flow("order").add(Reserve("reserve"), Charge("charge"))
    engine = engines.load(flow, backend=backend, book=book)
    with pytest.raises(RuntimeError, match="card declined"):
        engine.run()
    return FlowsSource(f"dir:{tmp_path}/store"), engine.storage.flow_uuid


def _node(dot: str, name: str) -> str:
    found = re.search(rf'^ *\w+ \[label="{name}\\n.*\];$', dot, re.MULTILINE)
    assert found, dot
    return found.group(0)


def test_the_failed_atom_is_outlined_and_named_among_the_reverted(tmp_path):
    # Given a flow whose second task failed, so that both ended REVERTED
    source, flow_uuid = _failed_run(tmp_path)
    dot = source.graph_dot(flow_uuid)
    failed, reverted = _node(dot, "charge"), _node(dot, "reserve")
    # Then both are coloured as reverted, and only the one that failed is outlined
    colour = graph_draw.STATE_COLOURS["REVERTED"]
    assert f'fillcolor="{colour}"' in failed and f'fillcolor="{colour}"' in reverted
    assert f'color="{graph_draw.FAILED_OUTLINE}"' in failed and "penwidth=3" in failed
    assert "failed here" in failed
    assert "penwidth" not in reverted and "failed here" not in reverted
    # And Graphviz reads it (when installed)
    if graph_draw.dot_program():
        assert b"failed here" in source.graph_svg(flow_uuid)


def test_a_drawn_flow_outlines_the_atoms_named_failed():
    flow = linear_flow.Flow("order").add(Reserve("reserve"), Charge("charge"))
    states = {"reserve": "REVERTED", "charge": "REVERTED"}
    dot = graph_draw.to_dot(flow, states, failed_atoms={"charge"})
    assert "failed here" in _node(dot, "charge") and "penwidth=3" in _node(dot, "charge")
    assert "failed here" not in _node(dot, "reserve")
    assert "failed here" not in graph_draw.to_dot(flow, states)
