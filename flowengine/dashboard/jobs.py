"""What the dashboard shows of a jobboard: the jobs it can list, filtered as the flow history.

A board lists its jobs on the board (UNCLAIMED or CLAIMED), in its dead
letter (DEAD), in its trash (TRASHED), and the jobs it consumed while it
keeps their outcome (``outcome_ttl_s``; their state is the outcome:
SUCCEEDED, REVERTED or FAILED). Each row is what ``flowengine jobs list
--json`` prints, read from the board on each request.
"""

from __future__ import annotations

import datetime
from typing import Any

from flowengine.dashboard.history import HistoryFilter

#: Jobs listed at most (the most recent first).
MAX_JOBS = 200

#: The job states the history's filter knows (as ``jobs list`` shows them,
#: plus where a parked job is, and how a consumed one ended).
JOB_STATES = ("UNCLAIMED", "CLAIMED", "DEAD", "TRASHED", "SUCCEEDED", "REVERTED", "FAILED")


class JobsSource:
    """Reads the jobs of the board at ``url`` named ``name`` (``jobs --board``/``--board-name``).

    Raises what connecting to the board raises, when built.
    """

    def __init__(self, url: str, name: str = "flowengine") -> None:
        from flowengine.utils.misc import mask_password

        self._conf = {"board": url}
        self._name = name
        self.safe_url = mask_password(url)
        self.list(HistoryFilter())  # fails now, naming the problem, rather than on every page

    def list(self, only: HistoryFilter) -> list[dict[str, Any]]:
        """The jobs ``only`` matches (state, name, creation time, owner), newest first.

        A finished job's owner, for the worker filter, is who finished it.
        """
        from flowengine.commands import jobs_cmd
        from flowengine.jobs import backends, records

        parked = {records.IN_DEAD_LETTER: "DEAD", records.IN_TRASH: "TRASHED"}
        rows = []
        with backends.backend(self._name, self._conf) as board:
            found = [
                (job, None) for job in (*board.listing(), *board.dead_letters(), *board.trashed())
            ]
            for job, done in (*found, *board.finished(MAX_JOBS)):
                row = jobs_cmd.describe(board, job, done)
                row["state"] = parked.get(row["where"], row["state"])
                if done is not None:
                    row["state"] = done.outcome.upper()
                    row["owner"] = done.who
                row["created_at"] = _iso(row.get("created_on"))
                if _matches(only, row):
                    rows.append(row)
        rows.sort(key=lambda r: (r["created_at"] or "", r["sequence"] or 0), reverse=True)
        return rows[:MAX_JOBS]


def _iso(value: Any) -> str | None:
    """A job's creation time (epoch seconds, or ISO text in naive UTC as TaskFlow writes it)."""
    if isinstance(value, (int, float)) and value:
        return datetime.datetime.fromtimestamp(value, datetime.UTC).isoformat()
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return (when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)).isoformat()


def _matches(only: HistoryFilter, row: dict[str, Any]) -> bool:
    if only.states and row["state"] not in only.states:
        return False
    if only.name and only.name.lower() not in str(row["name"]).lower():
        return False
    if only.since is not None or only.until is not None:
        created = datetime.datetime.fromisoformat(row["created_at"]) if row["created_at"] else None
        if created is None:
            return False
        if only.since is not None and created < only.since:
            return False
        if only.until is not None and created > only.until:
            return False
    return not only.worker or only.worker in str(row.get("owner") or "")
