"""Fixtures running the behaviour suite on every engine.

``engine_kind`` is parametrised over ENGINE_KINDS; ``make_engine(flow,
store=None, **options)`` loads a flow into an engine of that kind (options may
include ``flow_detail`` and ``backend``, passed on to ``engines.load``). Another
engine joins the suite by adding its name to ENGINE_KINDS and a loader to
ENGINE_LOADERS (``loader(flow, store, options) -> engine``); if its tasks run
outside the engine's process, add the name to OUT_OF_PROCESS_KINDS too.

Tests marked ``in_process`` use tasks that only work inside the engine's
process (closures, events, shared lists); they skip out-of-process kinds.
Task classes live in ``tests.engines.tasks`` so remote workers can import them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import pytest

# Make `tests.engines.tasks` importable under that dotted name (task classes
# are looked up by their qualified name by out-of-process executors).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from flowengine import engines  # noqa: E402


def _load(engine: str, **fixed: Any) -> Callable[[Any, Any, dict], Any]:
    def loader(flow: Any, store: Any, options: dict) -> Any:
        return engines.load(flow, store=store, engine=engine, **{**fixed, **options})
    return loader


ENGINE_KINDS: list[str] = ["serial", "parallel", "parallel-processes"]
OUT_OF_PROCESS_KINDS: set[str] = {"parallel-processes"}
ENGINE_LOADERS: dict[str, Callable[[Any, Any, dict], Any]] = {
    "serial": _load("serial"),
    "parallel": _load("parallel", max_workers=4),
    "parallel-processes": _load("parallel", executor="processes", max_workers=2),
}

# --- worker-based engine (owned by H7; see tests/worker_based/behaviour_pool.py) ---
# Tasks run on a shared pool of in-process workers over the memory transport;
# broker transports are added by the broker fixtures. Kept above the fixtures
# because pytest copies ENGINE_KINDS when @pytest.fixture(params=...) runs.
from tests.worker_based.behaviour_pool import load_worker_based  # noqa: E402

ENGINE_KINDS.append("worker-based")
OUT_OF_PROCESS_KINDS.add("worker-based")
ENGINE_LOADERS["worker-based"] = load_worker_based
# --- end of the worker-based section ---


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "in_process: the test's tasks only run inside the engine's process")


@pytest.fixture(params=ENGINE_KINDS)
def engine_kind(request: pytest.FixtureRequest) -> str:
    """The kind of engine a behaviour test runs on."""
    kind = request.param
    if kind in OUT_OF_PROCESS_KINDS and request.node.get_closest_marker("in_process"):
        pytest.skip(f"tasks of this test must run in the engine's process, not {kind}")
    return kind


@pytest.fixture
def make_engine(engine_kind: str) -> Callable[..., Any]:
    """``make_engine(flow, store=None, **options)`` -> an engine of ``engine_kind``."""
    def make(flow: Any, store: dict | None = None, **options: Any) -> Any:
        return ENGINE_LOADERS[engine_kind](flow, store, options)
    return make
