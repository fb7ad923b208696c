"""What a flowengine request carries on AMQP (see wire/headers.py): the common case.

Shared by the tests of flowengine's AMQP property writer, frame reader and
frame writer, which each compare their bytes or values with py-amqp's.
"""

from __future__ import annotations

import uuid

REQUEST_HEADERS = {
    "attempt": 0,
    "origin": "host:1234",
    "request_id": uuid.uuid4().hex,
    "expires": 1764400000.125,
    "heartbeat_misses": 3,
    "lost_after": 12.5,
    "late_pending": True,
    "created": 1764400000.1,
    "enqueued": 1764400000.2,
    "timelimit": [None, 30.5],
    "root_id": uuid.uuid4().hex,
    "parent_id": uuid.uuid4().hex,
    "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
}

REQUEST_PROPERTIES = {
    "content_type": "application/json",
    "content_encoding": "utf-8",
    "application_headers": REQUEST_HEADERS,
    "delivery_mode": 2,
    "priority": 0,
    "correlation_id": str(uuid.uuid4()),
    "reply_to": uuid.uuid4().hex,
    "type": "REQUEST",
}
