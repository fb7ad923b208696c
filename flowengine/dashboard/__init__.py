"""``flowengine dashboard``: a web page of live workers, throughput and persisted flows.

A Starlette application (served by uvicorn) pushes the state to plain
HTML/JavaScript pages through server-sent events: the workers and their
requests from ``inspect`` answers (no ``--events`` needed) and the event
stream, throughput and failure rate over time, and the flows a persistence
backend holds with their graph coloured by atom state. Optional:
``pip install 'flowengine[dashboard]'``.
"""

from __future__ import annotations

from flowengine.utils import optional

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised without the extra
    raise optional.missing_extra("dashboard", e) from e
