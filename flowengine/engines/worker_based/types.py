"""TaskFlow's module path for worker discovery; the code is in :mod:`.executor_side.discovery`."""

from flowengine.engines.worker_based.executor_side.discovery import ProxyWorkerFinder, TopicWorker

__all__ = ["ProxyWorkerFinder", "TopicWorker"]
