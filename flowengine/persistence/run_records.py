"""What commands and conductors record in a flow detail's metadata, beside TaskFlow's ``factory``.

Everything lives under one key, ``meta["flowengine"]``, so it cannot clash
with an application's own metadata::

    created_at, updated_at   ISO 8601 UTC: when the flow detail was created,
                             when a command's engine last changed its state
    engine                   the engine that ran it last (serial, worker-based...)
    owner                    the process running it (see process_owner.py)
    atoms                    atom names in execution order (for `flows show`)
    cwd                      the directory the factory was imported from
    retries                  one summary per `flows retry`: state and failures
                             of the attempt it discarded

TaskFlow's models have no flow detail times; flows persisted from Python
(``engines.load``) have none of these and show ``-`` where they would be.
"""

from __future__ import annotations

import datetime
from typing import Any

from flowengine.persistence import process_owner

#: Key of ``FlowDetail.meta`` holding the commands' records.
META_KEY = "flowengine"


def now() -> str:
    """The current time, ISO 8601 UTC (as stored)."""
    return datetime.datetime.now(datetime.UTC).isoformat()


def parse_time(text: Any) -> datetime.datetime | None:
    """A stored time back as a datetime (None if absent or unreadable)."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        return None


def of(flow_detail: Any) -> dict[str, Any]:
    """A copy of the commands' records in ``flow_detail`` (empty if none)."""
    found = flow_detail.meta.get(META_KEY) if isinstance(flow_detail.meta, dict) else None
    return dict(found) if isinstance(found, dict) else {}


def update(engine: Any, /, **fields: Any) -> None:
    """Merge ``fields`` into the records of ``engine``'s flow detail and save it."""
    records = dict(engine.storage.flow_meta.get(META_KEY) or {})
    records.update(fields)
    engine.storage.update_flow_metadata({META_KEY: records})


class Recorder:
    """Keeps a command's records in the flow detail its engine runs.

    :meth:`start` (before ``run()``) records this process as the owner, the
    engine, the atom order and the time; afterwards each flow state change
    refreshes ``updated_at``. Storage errors propagate from :meth:`start`;
    from the notifier they are logged (the notifier never raises).
    """

    def __init__(self, engine: Any, engine_name: str) -> None:
        self._engine = engine
        self._engine_name = engine_name

    def start(self, **extra: Any) -> None:
        """Record owner, engine, atom order and times; follow flow state changes."""
        engine = self._engine
        engine.compile()
        stamp = now()
        records = dict(engine.storage.flow_meta.get(META_KEY) or {})
        fields: dict[str, Any] = {
            "owner": process_owner.this_process(), "engine": self._engine_name,
            "atoms": list(engine.compilation.topological_order), "updated_at": stamp,
            **extra}
        if not records.get("created_at"):
            fields["created_at"] = stamp
        update(engine, **fields)
        engine.notifier.register(engine.notifier.ANY, self._on_flow_state)

    def _on_flow_state(self, state: str, details: dict[str, Any]) -> None:
        update(self._engine, updated_at=now())
