"""Logbooks, flow details and atom details as plain data, for tables and ``--json``."""

from __future__ import annotations

import datetime
import json
from collections import Counter
from typing import Any

from flowengine import states as st
from flowengine.commands.flows.settings import RESULT_SUMMARY_CHARS
from flowengine.commands.running import jsonable
from flowengine.jobs import masking
from flowengine.persistence import models, run_records
from flowengine.storage.base import StorageBase

#: Atom states, in the order counts are shown (done first, then the rest).
_ATOM_STATE_ORDER = (
    st.SUCCESS,
    st.RUNNING,
    st.PENDING,
    st.FAILURE,
    st.REVERTING,
    st.REVERTED,
    st.REVERT_FAILURE,
    st.RETRYING,
    st.IGNORE,
)
_EPOCH = datetime.datetime.min.replace(tzinfo=datetime.UTC)


def is_injector(ad: models.AtomDetail) -> bool:
    """Whether ``ad`` holds the flow's injected values rather than an atom's state."""
    return ad.name == StorageBase.injector_name


def atoms_in_order(fd: models.FlowDetail) -> list[models.AtomDetail]:
    """The flow's atom details in execution order when recorded, else by name."""
    rank = {name: i for i, name in enumerate(run_records.of(fd).get("atoms") or ())}
    atoms = [ad for ad in fd if not is_injector(ad)]
    return sorted(atoms, key=lambda ad: (rank.get(ad.name, len(rank)), ad.name))


def injected(fd: models.FlowDetail, reveal: bool = False) -> dict[str, Any]:
    """The values injected into the flow (``--store``).

    Secret-looking keys are masked by the rule job details follow in logs and
    ``jobs show`` (:func:`flowengine.jobs.masking.mask_secrets`), unless
    ``reveal``: the same store reads the same wherever it is shown.
    """
    for ad in fd:
        if is_injector(ad) and isinstance(ad.results, dict):
            return dict(ad.results) if reveal else masking.mask_secrets(dict(ad.results))
    return {}


def atom_counts(fd: models.FlowDetail) -> dict[str, int]:
    """How many atoms are in each state, in a fixed order."""
    counts = Counter(ad.state or st.PENDING for ad in fd if not is_injector(ad))
    ordered = {s: counts.pop(s) for s in _ATOM_STATE_ORDER if s in counts}
    ordered.update(sorted(counts.items()))
    return ordered


def times(fd: models.FlowDetail) -> tuple[datetime.datetime | None, datetime.datetime | None]:
    """``(created, updated)`` of a flow detail, when a command recorded them."""
    records = run_records.of(fd)
    return (
        run_records.parse_time(records.get("created_at")),
        run_records.parse_time(records.get("updated_at")),
    )


def newest_first(fds: list[models.FlowDetail]) -> list[models.FlowDetail]:
    """``fds`` newest first (flows without times after, by name)."""

    def key(fd: models.FlowDetail) -> tuple[datetime.datetime, str]:
        created = times(fd)[0]
        return (created or _EPOCH, fd.name)

    return sorted(fds, key=key, reverse=True)


def _iso(when: datetime.datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def factory_name(fd: models.FlowDetail) -> str | None:
    """The import path of the factory recorded for ``fd`` (None: none recorded)."""
    factory = fd.meta.get("factory") if isinstance(fd.meta, dict) else None
    name = factory.get("name") if isinstance(factory, dict) else None
    return name if isinstance(name, str) else None


def book_view(book: Any) -> dict[str, Any]:
    """A logbook's identity and times."""
    return {
        "uuid": book.uuid,
        "name": book.name,
        "created_at": _iso(book.created_at),
        "updated_at": _iso(book.updated_at),
    }


def flow_view(fd: models.FlowDetail) -> dict[str, Any]:
    """A flow detail's summary: state, times, factory, atom counts per state."""
    created, updated = times(fd)
    records = run_records.of(fd)
    return {
        "uuid": fd.uuid,
        "name": fd.name,
        "state": fd.state or st.PENDING,
        "created_at": _iso(created),
        "updated_at": _iso(updated),
        "factory": factory_name(fd),
        "engine": records.get("engine"),
        "owner": records.get("owner"),
        "atoms": atom_counts(fd),
    }


def summarize(value: Any, full: bool = False) -> str:
    """``value`` as one line of JSON, cut to RESULT_SUMMARY_CHARS unless ``full``."""
    text = json.dumps(jsonable(value), sort_keys=True, ensure_ascii=False)
    if full or len(text) <= RESULT_SUMMARY_CHARS:
        return text
    return text[: RESULT_SUMMARY_CHARS - 1] + "…"


def failure_view(failure: Any) -> dict[str, Any] | None:
    """A failure's exception types, message, traceback and causes (None if no failure)."""
    if failure is None:
        return None
    return {
        "exc_type_names": list(failure),
        "message": failure.exception_str,
        "traceback": failure.traceback_str or None,
        "causes": [failure_view(c) for c in failure.causes],
    }


def atom_run(fd: models.FlowDetail, name: str) -> dict[str, Any]:
    """When the atom last ran (queued, started, ended), how long, where, which attempt.

    Empty if not recorded. ``queued_at`` only for remote atoms (when the
    engine sent the request); ``duration_s`` is the body's time.
    """
    run = (run_records.of(fd).get("atom_runs") or {}).get(name)
    if not isinstance(run, dict):
        return {}
    queued, started, ended = (
        run_records.parse_time(run.get(k)) for k in ("queued_at", "started_at", "ended_at")
    )
    return {
        "queued_at": run.get("queued_at"),
        "started_at": run.get("started_at"),
        "ended_at": run.get("ended_at"),
        "state": run.get("state"),
        "duration_s": (ended - started).total_seconds() if started and ended else None,
        "queued_s": (started - queued).total_seconds() if queued and started else None,
        "worker": run.get("worker"),
        "attempt": run.get("attempt"),
    }


def workers_of(fd: models.FlowDetail) -> set[str]:
    """The workers the flow's atoms last ran on (as recorded)."""
    runs = run_records.of(fd).get("atom_runs") or {}
    return {
        str(run["worker"]) for run in runs.values() if isinstance(run, dict) and run.get("worker")
    }


def atom_view(ad: models.AtomDetail, fd: models.FlowDetail | None = None) -> dict[str, Any]:
    """Everything stored about an atom; a retry's history as a list of attempts."""
    is_retry = isinstance(ad, models.RetryDetail)
    view: dict[str, Any] = {
        "name": ad.name,
        "type": "retry" if is_retry else "task",
        "state": ad.state or st.PENDING,
        "intention": ad.intention,
        "result": None if is_retry else jsonable(ad.results),
        "failure": failure_view(ad.failure),
        "revert_result": jsonable(ad.revert_results),
        "revert_failure": failure_view(ad.revert_failure),
        "run": atom_run(fd, ad.name) if fd is not None else {},
    }
    if is_retry:
        view["history"] = [
            {
                "result": jsonable(result),
                "failures": {name: failure_view(f) for name, f in fails.items()},
            }
            for result, fails in ad.results
        ]
    return view


def show_view(book: Any, fd: models.FlowDetail, reveal: bool = False) -> dict[str, Any]:
    """The whole of one flow detail for ``flows show --json``; secrets masked unless ``reveal``."""
    view = flow_view(fd)
    view["atom_counts"] = view.pop("atoms")
    view.update(
        book=book_view(book) if book is not None else None,
        factory=fd.meta.get("factory"),
        injected=jsonable(injected(fd, reveal)),
        retries=run_records.of(fd).get("retries") or [],
        atoms=[atom_view(ad, fd) for ad in atoms_in_order(fd)],
    )
    return view
