"""TaskFlow's module path for endpoints; the code is in :mod:`.worker_side.endpoint`."""

from flowengine.engines.worker_based.worker_side.endpoint import Endpoint

__all__ = ["Endpoint"]
