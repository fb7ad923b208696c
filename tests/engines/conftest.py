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
from tests import fast_tier  # noqa: E402


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

# --- worker-based engine (see tests/worker_based/behaviour_pool.py) ---
# Tasks run on a shared pool of in-process workers over the memory transport;
# broker transports are added by the broker fixtures. Kept above the fixtures
# because pytest copies ENGINE_KINDS when @pytest.fixture(params=...) runs.
from tests.worker_based.behaviour_pool import load_worker_based  # noqa: E402

ENGINE_KINDS.append("worker-based")
OUT_OF_PROCESS_KINDS.add("worker-based")
ENGINE_LOADERS["worker-based"] = load_worker_based
# The same, every engine on the process's shared executor (engine option shared=True).
ENGINE_KINDS.append("worker-based-shared")
OUT_OF_PROCESS_KINDS.add("worker-based-shared")
ENGINE_LOADERS["worker-based-shared"] = lambda flow, store, options: load_worker_based(
    flow, store, {"shared": True, **options}
)
# The same, workers sparing the PENDING of requests they answer at once (late_pending=True).
ENGINE_KINDS.append("worker-based-late-pending")
OUT_OF_PROCESS_KINDS.add("worker-based-late-pending")
ENGINE_LOADERS["worker-based-late-pending"] = lambda flow, store, options: load_worker_based(
    flow, store, {"late_pending": True, **options}
)
# --- end of the worker-based section ---

# --- worker-based engine on real worker processes (tests/worker_based/process_pool.py) ---
# Two `flowengine worker` processes per broker, started once per session by
# the fixture named in KIND_FIXTURES the first time a test of that kind runs.
from tests.worker_based import process_pool  # noqa: E402

#: engine kind -> fixture that must be set up before a test of that kind runs.
KIND_FIXTURES: dict[str, str] = {
    "worker-based-filesystem": "worker_pool_filesystem",
    "worker-based-redis": "worker_pool_redis",
    "worker-based-amqp": "worker_pool_amqp",
}
ENGINE_KINDS += [
    pytest.param("worker-based-filesystem", marks=pytest.mark.worker_processes),
    pytest.param("worker-based-redis", marks=[pytest.mark.worker_processes, pytest.mark.broker]),
    pytest.param("worker-based-amqp", marks=[pytest.mark.worker_processes, pytest.mark.broker]),
]
for _kind in KIND_FIXTURES:
    OUT_OF_PROCESS_KINDS.add(_kind)
    ENGINE_LOADERS[_kind] = process_pool.loader(_kind)


def _pool_fixture(kind: str, make: Callable[[pytest.FixtureRequest], Any]) -> Any:
    @pytest.fixture(scope="session")
    def fixture(request: pytest.FixtureRequest) -> Any:
        fast_tier.refuse(f"worker processes ({kind})")
        pool = make(request)
        pool.start()
        process_pool.ACTIVE[kind] = pool
        yield pool
        process_pool.ACTIVE.pop(kind, None)
        pool.stop()

    return fixture


worker_pool_filesystem = _pool_fixture(
    "worker-based-filesystem",
    lambda request: process_pool.filesystem_pool(
        str(request.getfixturevalue("tmp_path_factory").mktemp("pool-broker"))
    ),
)
worker_pool_redis = _pool_fixture(
    "worker-based-redis",
    lambda request: process_pool.ProcessPool("redis", request.getfixturevalue("redis_url")),
)
worker_pool_amqp = _pool_fixture(
    "worker-based-amqp",
    lambda request: process_pool.ProcessPool("amqp", request.getfixturevalue("amqp_url")),
)
# --- end of the real-worker-process section ---


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "in_process: the test's tasks only run inside the engine's process"
    )


@pytest.fixture(params=ENGINE_KINDS)
def engine_kind(request: pytest.FixtureRequest) -> str:
    """The kind of engine a behaviour test runs on."""
    kind = request.param
    if kind in OUT_OF_PROCESS_KINDS and request.node.get_closest_marker("in_process"):
        pytest.skip(f"tasks of this test must run in the engine's process, not {kind}")
    if kind in KIND_FIXTURES:
        request.getfixturevalue(KIND_FIXTURES[kind])
    return kind


@pytest.fixture
def make_engine(engine_kind: str) -> Callable[..., Any]:
    """``make_engine(flow, store=None, **options)`` -> an engine of ``engine_kind``."""

    def make(flow: Any, store: dict | None = None, **options: Any) -> Any:
        return ENGINE_LOADERS[engine_kind](flow, store, options)

    return make
