"""An engine that stops with requests in flight asks their workers to cancel them.

Best effort, before the reply queue goes: one CONTROL ``cancel`` per request
to the worker known to hold it (its PENDING/RUNNING replies named it),
each publish bounded by CANCEL_PUBLISH_TIMEOUT_S, nothing waited for. The
worker drops a request not started yet, raises the cancellation flag of a
running one, or kills its child under the process executor (see
``worker_side/activity.py``). Workers that do not know CONTROL (TaskFlow's)
never bind its key: the message reaches nobody.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from flowengine.engines.worker_based.messaging import control_client
from flowengine.engines.worker_based.messaging.proxy import Proxy
from flowengine.engines.worker_based.wire import control as wc
from flowengine.engines.worker_based.wire import names

LOG = logging.getLogger(__name__)

#: Bound (s) on each cancel publish: the engine is stopping on a person's
#: second Ctrl-C and must not hang on a broker that went away.
CANCEL_PUBLISH_TIMEOUT_S = 1.0


def cancel_held(proxy: Proxy, holders: Mapping[str, str]) -> int:
    """Ask each holder to cancel its request (uuid -> worker id); how many were asked."""
    asked = 0
    for request_uuid, worker_id in holders.items():
        message = wc.ControlRequest(wc.CANCEL, {"request": request_uuid}, (worker_id,))
        try:
            proxy.publish(
                message,
                control_client.routing_keys((worker_id,)),
                headers={names.HEADER_ORIGIN: names.make_origin()},
                timeout_s=CANCEL_PUBLISH_TIMEOUT_S,
            )
        except Exception as e:
            LOG.warning(
                "Could not ask worker %s to cancel request %s (%s); not asking the others",
                worker_id,
                request_uuid,
                e,
            )
            break
        asked += 1
        LOG.info(
            "Asked worker %s to cancel request %s: this engine stops without waiting for it",
            worker_id,
            request_uuid,
        )
    return asked
