"""TaskFlow's module path for the engine; the code is in :mod:`.executor_side.engine`."""

from flowengine.engines.worker_based.executor_side.engine import WorkerBasedActionEngine

__all__ = ["WorkerBasedActionEngine"]
