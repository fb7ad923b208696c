"""What commands and conductors record in a flow detail's metadata, beside TaskFlow's ``factory``.

Everything lives under one key, ``meta["flowengine"]``, so it cannot clash
with an application's own metadata::

    created_at, updated_at   ISO 8601 UTC: when the flow detail was created,
                             when a command's engine last changed its state
    engine                   the engine that ran it last (serial, worker-based...)
    owner                    the process running it (see process_owner.py)
    atoms                    atom names in execution order (for `flows show`)
    atom_runs                per atom, its last execution: started_at, ended_at
                             (ISO 8601 UTC), state it ended in (SUCCESS or
                             FAILURE), attempt (1 for its first execution in
                             this run, 2 after a retry controller ran it
                             again...); remote ones also worker and queued_at
                             (when the engine sent the request; started_at is
                             then when the worker began its body);
                             written with the flow's state changes (its end)
    exchange, topics         where a worker-based engine sent its requests (so
                             the dashboard can retry/resume it there)
    cwd                      the directory the factory was imported from
    retries                  one summary per `flows retry`: state and failures
                             of the attempt it discarded

TaskFlow's models have no flow detail times; flows persisted from Python
(``engines.load``) have none of these and show ``-`` where they would be.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

from flowengine import states
from flowengine.persistence import process_owner

#: Atom states that end an execution (reverts are not recorded: where and how
#: long an atom *ran* is what `flows show` tells, a failed one's above all).
_ENDS = frozenset({states.SUCCESS, states.FAILURE})

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
        #: Atom name -> when its running run started (ISO), until it ends.
        self._started: dict[str, str] = {}
        #: Runs ended since the last flow state change (written with the next one).
        self._runs: dict[str, dict[str, Any]] = {}
        #: Atom name -> executions started by this engine (a retry controller reruns).
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()  # atom states may come from several threads

    def start(self, **extra: Any) -> None:
        """Record owner, engine, atom order and times; follow flow state changes."""
        engine = self._engine
        engine.compile()
        stamp = now()
        records = dict(engine.storage.flow_meta.get(META_KEY) or {})
        fields: dict[str, Any] = {
            "owner": process_owner.this_process(),
            "engine": self._engine_name,
            "atoms": list(engine.compilation.topological_order),
            "updated_at": stamp,
            **extra,
        }
        if not records.get("created_at"):
            fields["created_at"] = stamp
        options = getattr(engine, "options", None) or {}
        if options.get("topics"):
            # No URL: it may hold a password; whoever reruns names the broker.
            fields.update(exchange=options.get("exchange"), topics=list(options["topics"]))
        update(engine, **fields)
        engine.notifier.register(engine.notifier.ANY, self._on_flow_state)
        engine.atom_notifier.register(engine.atom_notifier.ANY, self._on_atom_state)

    def _on_flow_state(self, state: str, details: dict[str, Any]) -> None:
        fields: dict[str, Any] = {"updated_at": now()}
        with self._lock:
            ended, self._runs = self._runs, {}
        if ended:
            # The atoms' runs ride along with the flow's own state changes: no
            # write of its own per atom (a flow's end writes them all). Remote
            # atoms name their worker (one look at the engine's statistics).
            remote = getattr(self._engine, "statistics", {}).get("atoms") or {}
            for name, run in ended.items():
                _add_remote_times(run, remote.get(name) or {})
            runs = dict(self._engine.storage.flow_meta.get(META_KEY, {}).get("atom_runs") or {})
            runs.update(ended)
            fields["atom_runs"] = runs
        update(self._engine, **fields)

    def _on_atom_state(self, state: str, details: dict[str, Any]) -> None:
        """Remember when each atom ran, where, and how it ended."""
        name = details.get("task_name") or details.get("retry_name")
        if name is None:
            return
        if state == states.RUNNING:
            with self._lock:
                self._started[name] = now()
                self._attempts[name] = self._attempts.get(name, 0) + 1
            return
        if state not in _ENDS:
            return
        with self._lock:
            self._runs[name] = {
                "started_at": self._started.pop(name, None),
                "ended_at": now(),
                "state": state,
                "attempt": self._attempts.get(name, 1),
            }


def _add_remote_times(run: dict[str, Any], remote: dict[str, Any]) -> None:
    """Split a remote atom's run into its time queued and its time on the worker.

    The engine saw the atom RUNNING when it sent the request; its worker
    began the body ``run_time`` seconds before the end (the engine's
    statistics, as the worker measured it).
    """
    worker = remote.get("worker_id")
    if not worker:
        return
    run["worker"] = worker
    ended = parse_time(run.get("ended_at"))
    run_time = remote.get("run_time")
    if ended is None or not isinstance(run_time, (int, float)) or run.get("started_at") is None:
        return
    body_started = ended - datetime.timedelta(seconds=run_time)
    sent = parse_time(run["started_at"])
    run["queued_at"] = run["started_at"]
    run["started_at"] = max(body_started, sent).isoformat() if sent else body_started.isoformat()
