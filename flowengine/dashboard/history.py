"""Which persisted flows the dashboard's history shows: filters by state, name, time, worker.

A filter comes from the page's query string (``/api/flows?state=REVERTED&
name=order&since=...&until=...&worker=...``) and is applied to each flow
detail the backend holds, so the list and the filter always read the same
stored records (see :mod:`flowengine.persistence.run_records`).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from flowengine.commands.flows import settings, views


class BadFilter(ValueError):
    """A query parameter of the history that cannot be read (says which and why)."""


@dataclasses.dataclass(frozen=True)
class HistoryFilter:
    """What a flow must match to be listed; empty fields match everything.

    ``states``: its state is one of them; ``name``: its name contains it
    (case-insensitive); ``since``/``until``: it was active in that range
    (updated at or after ``since``, created at or before ``until``; a flow
    with no recorded times never matches a time range); ``worker``: one of
    its atoms last ran on a worker whose id contains it.
    """

    states: tuple[str, ...] = ()
    name: str = ""
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    worker: str = ""

    @classmethod
    def from_query(
        cls,
        query: Mapping[str, Any],
        states: Sequence[str] = (),
        known: Sequence[str] = settings.FLOW_STATES,
        kind: str = "flow",
    ) -> HistoryFilter:
        """From query parameters (``states`` the repeated ``state`` values); BadFilter if wrong.

        ``known``: the states a ``kind`` (flow, job) may be in.
        """
        chosen = tuple(s.upper() for s in states if s)
        for state in chosen:
            if state not in known:
                raise BadFilter(f"state={state}: not a {kind} state (one of {', '.join(known)})")
        return cls(
            states=chosen,
            name=str(query.get("name") or "").strip(),
            since=_time(query, "since"),
            until=_time(query, "until"),
            worker=str(query.get("worker") or "").strip(),
        )

    def matches(self, fd: Any) -> bool:
        """Whether flow detail ``fd`` is listed."""
        if self.states and (fd.state or "PENDING") not in self.states:
            return False
        if self.name and self.name.lower() not in (fd.name or "").lower():
            return False
        if self.since is not None or self.until is not None:
            created, updated = views.times(fd)
            if created is None or updated is None:
                return False
            if self.since is not None and updated < self.since:
                return False
            if self.until is not None and created > self.until:
                return False
        if self.worker:
            return any(self.worker in worker for worker in views.workers_of(fd))
        return True


def _time(query: Mapping[str, Any], key: str) -> datetime.datetime | None:
    """An ISO 8601 time of the query (UTC when it names no zone); None if absent."""
    text = str(query.get(key) or "").strip()
    if not text:
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise BadFilter(f"{key}={text}: not an ISO 8601 time (e.g. 2026-11-29T09:00:00Z)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)
