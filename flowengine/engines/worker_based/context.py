"""What task code can learn about the request it runs for; see :mod:`.worker_side.context`."""

from flowengine.engines.worker_based.worker_side.context import RequestContext, current

__all__ = ["RequestContext", "current"]
