"""Conductors (TaskFlow's ``taskflow.conductors.base``): claim jobs, run them, finish them.

A conductor takes jobs from a jobboard, loads each job's flow from
persistence into an engine, runs it, and consumes the job (or abandons or
trashes it). If the conductor dies, its leases run out and another
conductor resumes the job from what was persisted.

What a flowengine conductor adds to TaskFlow's: the engine's persistence
writes are fenced with the job's claim token (:mod:`flowengine.persistence.
fencing`), so a conductor that lost its job while paused cannot overwrite
the new owner's progress; and a job's details may name the engine and its
options (``engine``, ``engine_options``), merged over the conductor's.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import threading
from typing import Any

from flowengine import engines
from flowengine import exceptions as excp
from flowengine.persistence import fencing, run_records
from flowengine.types import entity, notifier
from flowengine.utils import misc

__all__ = ["Conductor"]

LOG = logging.getLogger(__name__)


class Conductor(abc.ABC):
    """Base of every conductor: a name, a jobboard, persistence, engine settings.

    ``engine`` and ``engine_options`` are used for every job unless the job's
    details override them (when ``allow_job_engine_options``).
    """

    #: Entity kind used when creating new entity objects.
    ENTITY_KIND = "conductor"

    def __init__(
        self,
        name: str,
        jobboard: Any,
        persistence: Any = None,
        engine: Any = None,
        engine_options: dict[str, Any] | None = None,
        allow_job_engine_options: bool = True,
    ) -> None:
        self._name = name
        self._jobboard = jobboard
        self._engine = engine
        self._engine_options = dict(engine_options or {})
        self._persistence = persistence
        self._allow_job_engine_options = allow_job_engine_options
        self._lock = threading.RLock()
        self._notifier = notifier.Notifier()
        self._entity: entity.Entity | None = None

    @property
    def conductor(self) -> entity.Entity:
        """The entity representing this conductor (``name@host:pid``)."""
        if self._entity is None:
            hostname = misc.get_hostname()
            pid = os.getpid()
            self._entity = entity.Entity(
                self.ENTITY_KIND,
                f"{self._name}@{hostname}:{pid}",
                {"hostname": hostname, "pid": pid},
            )
        return self._entity

    @property
    def notifier(self) -> notifier.Notifier:
        """Where the conductor's events are emitted (see EVENTS_EMITTED of each kind)."""
        return self._notifier

    def _flow_detail_from_job(self, job: Any, book: Any = None) -> Any:
        """The flow detail a job runs: ``details['flow_uuid']`` in its book, or its only one.

        Raises NotFound (no book / no such flow detail) or MultipleChoices.
        """
        book = book if book is not None else job.book
        if book is None:
            raise excp.NotFound("No book found in job")
        if job.details and "flow_uuid" in job.details:
            flow_uuid = job.details["flow_uuid"]
            flow_detail = book.find(flow_uuid)
            if flow_detail is None:
                raise excp.NotFound(
                    f"No matching flow detail found in jobs book for flow"
                    f" detail with uuid {flow_uuid}"
                )
            return flow_detail
        choices = len(book)
        if choices == 1:
            return list(book)[0]
        if choices == 0:
            raise excp.NotFound("No flow detail(s) found in jobs book")
        raise excp.MultipleChoices(
            f"No matching flow detail found ({choices} choices) in jobs book"
        )

    def _job_persistence(self, job: Any) -> Any:
        """The backend this job's engine writes through: fenced by its claim token.

        The fence is advanced first (FencedOut if a newer claim got there).
        Backends that cannot fence, and jobs claimed without a token, use
        the plain backend.
        """
        token = getattr(job, "token", 0)
        if (
            self._persistence is None
            or not token
            or not fencing.supports_fencing(self._persistence)
        ):
            return self._persistence
        flow_uuid = (job.details or {}).get("flow_uuid")
        if flow_uuid is None:
            book = None
            if job.book_uuid is not None:
                with contextlib.closing(self._persistence.get_connection()) as conn:
                    book = conn.get_logbook(job.book_uuid)
            flow_uuid = self._flow_detail_from_job(job, book).uuid
        fenced = fencing.FencedBackend(self._persistence, fencing.Fence(flow_uuid, token))
        fenced.advance()
        return fenced

    def _engine_settings(self, job: Any) -> tuple[Any, dict[str, Any]]:
        engine, options = self._engine, dict(self._engine_options)
        details = job.details or {}
        if self._allow_job_engine_options:
            engine = details.get("engine", engine)
            job_options = details.get("engine_options") or {}
            if not isinstance(job_options, dict):
                raise excp.JobFailure(
                    f"Job {job.uuid}: details['engine_options'] must be a"
                    f" dict, not {type(job_options).__name__}"
                )
            if (
                job_options
                and "broker" in options
                and any(key in job_options for key in _broker_option_keys())
            ):
                # The job names its broker: the conductor's BrokerSettings
                # yields, as every other option of the conductor does. (Only
                # looked at when both name one: the keys' module imports
                # kombu, 60 ms that a conductor of local engines never needs.)
                options.pop("broker", None)
            options.update(job_options)
        return engine, options

    def _engine_from_job(self, job: Any) -> Any:
        """Load the job's flow detail (fresh, after fencing) into an engine."""
        backend = self._job_persistence(job)
        book = None
        if backend is not None and job.book_uuid is not None:
            # Read after advancing the fence: everything an older claimer
            # managed to write before it was fenced out is seen here.
            with contextlib.closing(backend.get_connection()) as conn:
                book = conn.get_logbook(job.book_uuid)
        flow_detail = self._flow_detail_from_job(job, book)
        store: dict[str, Any] = {}
        if flow_detail.meta and "store" in flow_detail.meta:
            store.update(flow_detail.meta["store"])
        if job.details and "store" in job.details:
            store.update(job.details["store"])
        engine, options = self._engine_settings(job)
        loaded = engines.load_from_detail(
            flow_detail, store=store, engine=engine, backend=backend, **options
        )
        if backend is not None:
            # What `flowengine run` records too (times, engine, atom order, the
            # running process): `flows list/show` and the dashboard show a
            # conductor's flows like any other. Written through the fenced backend.
            name = engine if isinstance(engine, str) and engine != "default" else "serial"
            run_records.Recorder(loaded, name).start(job=job.uuid)
        return loaded

    def _listeners_from_job(self, job: Any, engine: Any) -> list[Any]:
        """Listeners to attach to the engine running ``job`` (override to add some)."""
        return []

    def connect(self) -> None:
        """Connect the jobboard (nothing if it already is)."""
        with self._lock:
            if not self._jobboard.connected:
                self._jobboard.connect()

    def close(self) -> None:
        """Close the jobboard."""
        with self._lock:
            self._jobboard.close()

    @abc.abstractmethod
    def run(self, max_dispatches: int | None = None) -> None:
        """Claim, run and finish jobs until stopped (or ``max_dispatches`` were dispatched)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Ask the conductor to stop; returns at once."""

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> bool:
        """Wait for run() to end: True, or False after ``timeout`` seconds."""

    @abc.abstractmethod
    def _dispatch_job(self, job: Any) -> Any:
        """Run one claimed job; returns whether to consume it (TaskFlow's contract)."""


def _broker_option_keys() -> tuple[str, ...]:
    """Engine options naming the broker (imported late: kombu only when jobs run)."""
    from flowengine.engines.worker_based.messaging.settings import BROKER_OPTION_KEYS

    return BROKER_OPTION_KEYS
