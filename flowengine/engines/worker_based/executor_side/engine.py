"""The worker-based engine: an action engine whose tasks run on remote workers."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any, cast

from flowengine import exceptions as exc
from flowengine.engines.action_engine import engine
from flowengine.engines.action_engine import executor as base_executor
from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based.events import hooks as event_hooks
from flowengine.engines.worker_based.executor_side import executor, remote_failures, sharing
from flowengine.engines.worker_based.executor_side.policy import RequestPolicy
from flowengine.engines.worker_based.messaging.settings import BrokerSettings

# Exchange used when the 'exchange' option is not given (TaskFlow's default).
DEFAULT_EXCHANGE = "default"

#: Values of the 'remote_exceptions' option: how run() raises one remote failure.
REMOTE_EXCEPTIONS = ("wrapped", "original")

# Methods an object given as the 'executor' option must have to stand in for
# a WorkerTaskExecutor.
_EXECUTOR_METHODS = ("execute_task", "revert_task", "start", "stop", "wait_for_workers")


class WorkerBasedActionEngine(engine.ActionEngine):
    """Worker based action engine.

    Specific backend options (extracted from provided engine options):

    - ``exchange``: broker exchange name in which executor / worker
      communication is performed (default ``'default'``)
    - ``url``: broker connection url (see kombu's documentation for its format)
    - ``broker``: a :class:`~..messaging.settings.BrokerSettings` standing for
      every broker option below (``url``, ``transport``, ``transport_options``,
      ``retry_options``, ``durable``, ``secret``, ``compat``,
      ``max_body_bytes``, ``max_redeliveries``, ``queue_type``,
      ``failover_strategy``): the same value a Worker takes; ValueError when
      given with any of them
    - ``topics``: list of worker topics to communicate with; only workers of
      these topics run the flow's tasks (none given: every worker that
      announces itself on the exchange is used)
    - ``transport``: transport to be used (e.g. amqp, memory, filesystem)
    - ``transition_timeout``: seconds (or None for infinite) a submitted
      request may stay in the WAITING/PENDING states; after that its task's
      result becomes a RequestTimeout failure
    - ``transport_options``: transport specific options (see kombu's docs)
    - ``retry_options``: reconnection options (see Proxy.DEFAULT_RETRY_OPTIONS)
    - ``heartbeat_misses`` (default 3), ``heartbeat_interval`` (default 2 s,
      used for workers that advertise none), ``lost_after`` (seconds; overrides
      interval x misses), ``max_attempts`` (default 3), ``run_timeout``
      (seconds a request may run, default None): liveness of remote requests,
      see doc/source/reliability.rst
    - ``worker_expiry``: seconds (or negative/zero/None for infinite) after
      which a worker that has not answered notifications is forgotten
    - ``durable``: True for a durable exchange and queues and persistent
      messages (queued requests survive a broker restart); every worker on
      the exchange must use the same setting
    - ``queue_type``: ``'quorum'`` (with ``durable``, RabbitMQ only) declares
      the queues as quorum queues, replicated across the nodes of a RabbitMQ
      cluster; ``'classic'`` (default); every worker on the exchange must use
      the same (see doc/source/deployment.rst)
    - ``failover_strategy``: ``'round-robin'`` (default) or ``'shuffle'``, the
      order in which the URLs of a failover list (``amqp://h1//;amqp://h2//``)
      are tried when connecting again
    - ``secret``: shared key (or list of keys, the first signs) to sign and
      verify every message; default: ``$FLOWENGINE_SECRET_FILE`` /
      ``$FLOWENGINE_SECRET``, none if unset
    - ``compat``: ``'taskflow'`` to share the exchange with TaskFlow workers
      and engines (declares what TaskFlow declares; see migration.rst)
    - ``max_body_bytes`` (default 8 MiB; None: no limit): larger replies are
      refused unread and larger requests are not sent;
      ``max_redeliveries`` (default 3): how many times a message may be in
      hand when the reply consume loop fails before it is dead-lettered
      (see doc/source/reliability.rst)
    - ``executor``: a WorkerTaskExecutor (or an object with the same methods)
      to use instead of creating one
    - ``shared``: True to run on an executor shared by every engine of this
      process with the same broker and options (default False: one per
      engine): no connection, reply queue, thread or worker discovery of
      its own, so a short flow starts at once and many flows at a time cost
      one executor; it closes once unused for 30 s (see
      :mod:`.executor_side.sharing`)
    - ``events``: publish flow-started/flow-finished/task-retried events on
      ``<exchange>.events`` (default False; see :mod:`.events`)
    - ``remote_exceptions``: ``'wrapped'`` (default, as TaskFlow) makes run()
      raise a single remote task's failure as WrappedFailure; ``'original'``
      raises the task's own exception, as the local engines do, when its
      class is already loaded here and can be rebuilt from the sent
      arguments (else it stays wrapped)

    ``statistics`` gains ``atoms``: per remote atom, its queue time, run time
    and attempts (see :class:`.remote_stats.RemoteStatistics`).

    Raises TypeError at load time when ``executor`` is not executor-like.
    """

    def __init__(self, flow: Any, flow_detail: Any, backend: Any, options: Any) -> None:
        super().__init__(flow, flow_detail, backend, options)
        self._remote_exceptions = self._options.get("remote_exceptions", "wrapped")
        if self._remote_exceptions not in REMOTE_EXCEPTIONS:
            raise ValueError(
                f"remote_exceptions must be one of {', '.join(REMOTE_EXCEPTIONS)}"
                f" (got {self._remote_exceptions!r})"
            )
        self._flow_events = event_hooks.FlowEvents.from_options(
            self._options, self._options.get("exchange") or DEFAULT_EXCHANGE
        )
        self._flow_events.attach(self)
        remote = getattr(self._task_executor, "remote_statistics", None)
        if remote is not None:
            # Timings describe the latest run, like the rest of the statistics.
            self.notifier.register("RUNNING", lambda _state, details: remote.clear())

    def run(self, timeout: float | None = None) -> None:
        """Run the flow (see ActionEngine.run); ``remote_exceptions`` says how failures raise."""
        try:
            super().run(timeout=timeout)
        except exc.WrappedFailure as wrapped:
            if self._remote_exceptions == "original" and len(wrapped) == 1:
                revived = remote_failures.revive(wrapped[0])
                if revived.exc_info is not None:
                    revived.reraise()
            raise

    @property
    def statistics(self) -> dict[str, Any]:
        """The engine's statistics plus ``atoms``: timings of each remote atom."""
        stats = dict(super().statistics)
        remote = getattr(self._task_executor, "remote_statistics", None)
        if remote is not None:
            stats["atoms"] = remote.snapshot()
        return stats

    def _task_executor_factory(self) -> base_executor.TaskExecutor:
        """Use the given executor or build a WorkerTaskExecutor from the options."""
        # The 'executor' option may be any object with the executor's methods
        # (checked by name in _fetch_task_executor): duck-typed, as TaskFlow's.
        return cast(
            base_executor.TaskExecutor, self._fetch_task_executor(self._options, self._flow_detail)
        )

    @classmethod
    def _fetch_task_executor(cls, options: dict[str, Any], flow_detail: Any) -> Any:
        """Validate the 'executor' option or build one from the other options."""
        given = options.get("executor")
        if given is not None:
            missing = [m for m in _EXECUTOR_METHODS if not callable(getattr(given, m, None))]
            if missing:
                raise TypeError(
                    f"Expected an instance of type"
                    f" '{executor.WorkerTaskExecutor.__name__}' (or one with"
                    f" methods {', '.join(_EXECUTOR_METHODS)}) instead of type"
                    f" '{type(given).__name__}' for 'executor' option"
                )
            return given
        flow_uuid = getattr(flow_detail, "uuid", None)
        topics = options.get("topics") or []
        if isinstance(topics, str):
            topics = [topics]
        settings = {
            "exchange": options.get("exchange") or DEFAULT_EXCHANGE,
            "topics": list(topics),
            "worker_expiry": options.get("worker_expiry", pr.EXPIRES_AFTER_S),
            "broker": BrokerSettings.from_options(options),
            "policy": RequestPolicy.from_options(options),
        }

        def make() -> executor.WorkerTaskExecutor:
            # A fresh reply queue per executor (not the flow detail's uuid as
            # TaskFlow does): a resumed run must never read replies meant
            # for an earlier engine working on the same flow detail.
            return executor.WorkerTaskExecutor(uuid=uuidlib.uuid4().hex, **settings)

        if options.get("shared"):
            key = sharing.pool_key(**settings)
            return sharing.EngineSession(sharing.POOL, key, make, flow_uuid, flow_uuid)
        made = make()
        made.set_trace_ids(flow_uuid, flow_uuid)
        return made
