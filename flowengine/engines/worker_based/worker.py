"""TaskFlow's module path for the worker; the code is in :mod:`.worker_side.worker`."""

from flowengine.engines.worker_based.worker_side.worker import Worker, derive_endpoints

__all__ = ["Worker", "derive_endpoints"]
