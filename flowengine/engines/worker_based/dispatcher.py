"""TaskFlow's module path for the dispatcher; the code is in :mod:`.messaging.dispatcher`."""

from flowengine.engines.worker_based.messaging.dispatcher import Handler, TypeDispatcher

__all__ = ["Handler", "TypeDispatcher"]
