"""Reading the envelope of a message a virtual transport stored: whatever it holds.

kombu's virtual transports (flowengine's Redis and filesystem ones) store
each message as a JSON envelope (body, headers, properties) written with
kombu's JSON, which reads a mapping of exactly ``__type__`` and
``__value__`` back as the object it names -- and raises when the type is
unknown or the value does not fit (``{"__type__": "uuid", "__value__":
"zz"}``). A publisher's header or property of that shape made the envelope
unreadable, and the transport dropped the message undelivered, where AMQP
and the memory transport deliver it (and the consume loop refuses it into a
dead-letter queue, or handles it). Such an envelope is read as plain JSON
instead: those mappings stay mappings, as on AMQP.
"""

from __future__ import annotations

import json
from typing import Any

from flowengine.engines.worker_based.wire.json_text import read_json

__all__ = ["read_envelope"]


def read_envelope(text: str) -> Any:
    """The envelope in ``text``, as kombu's JSON reads it, else as plain JSON.

    Raises what plain JSON raises for text that is not JSON at all.
    """
    try:
        return read_json(text)
    except Exception:
        # kombu's type tags that do not decode (see the module's docstring).
        return json.loads(text)
