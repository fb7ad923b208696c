"""TaskFlow's module path for the proxy; the code is in :mod:`.messaging.proxy`."""

from flowengine.engines.worker_based.messaging.proxy import (
    ConnectionDetails,
    Proxy,
    QueueSpec,
    TransportDetails,
    mask_options,
)

__all__ = ["ConnectionDetails", "Proxy", "QueueSpec", "TransportDetails", "mask_options"]
