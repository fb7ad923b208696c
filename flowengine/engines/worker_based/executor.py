"""TaskFlow's module path for the executor; the code is in :mod:`.executor_side.executor`."""

from flowengine.engines.worker_based.executor_side.executor import WorkerTaskExecutor

__all__ = ["WorkerTaskExecutor"]
