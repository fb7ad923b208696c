"""The worker-based engine: an action engine whose tasks run on remote workers."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from flowengine.engines.action_engine import engine
from flowengine.engines.action_engine import executor as base_executor
from flowengine.engines.worker_based import executor
from flowengine.engines.worker_based import protocol as pr

# Exchange used when the 'exchange' option is not given (TaskFlow's default).
DEFAULT_EXCHANGE = "default"

# Methods an object given as the 'executor' option must have to stand in for
# a WorkerTaskExecutor.
_EXECUTOR_METHODS = ("execute_task", "revert_task", "start", "stop", "wait_for_workers")


class WorkerBasedActionEngine(engine.ActionEngine):
    """Worker based action engine.

    Specific backend options (extracted from provided engine options):

    - ``exchange``: broker exchange name in which executor / worker
      communication is performed (default ``'default'``)
    - ``url``: broker connection url (see kombu's documentation for its format)
    - ``topics``: list of worker topics to communicate with (more are learned
      from the announcements that workers emit)
    - ``transport``: transport to be used (e.g. amqp, memory, filesystem)
    - ``transition_timeout``: seconds (or None for infinite) a submitted
      request may stay in the WAITING/PENDING states; after that its task's
      result becomes a RequestTimeout failure
    - ``transport_options``: transport specific options (see kombu's docs)
    - ``retry_options``: reconnection options (see Proxy.DEFAULT_RETRY_OPTIONS)
    - ``worker_expiry``: seconds (or negative/zero/None for infinite) after
      which a worker that has not answered notifications is forgotten
    - ``executor``: a WorkerTaskExecutor (or an object with the same methods)
      to use instead of creating one

    Raises TypeError at load time when ``executor`` is not executor-like.
    """

    def _task_executor_factory(self) -> base_executor.TaskExecutor:
        """Use the given executor or build a WorkerTaskExecutor from the options."""
        return self._fetch_task_executor(self._options, self._flow_detail)

    @classmethod
    def _fetch_task_executor(cls, options: dict[str, Any], flow_detail: Any) -> Any:
        """Validate the 'executor' option or build one from the other options."""
        given = options.get("executor")
        if given is not None:
            missing = [m for m in _EXECUTOR_METHODS if not callable(getattr(given, m, None))]
            if missing:
                raise TypeError(f"Expected an instance of type"
                                f" '{executor.WorkerTaskExecutor.__name__}' (or one with"
                                f" methods {', '.join(_EXECUTOR_METHODS)}) instead of type"
                                f" '{type(given).__name__}' for 'executor' option")
            return given
        flow_uuid = getattr(flow_detail, "uuid", None)
        topics = options.get("topics") or []
        if isinstance(topics, str):
            topics = [topics]
        # A fresh reply queue per engine (not the flow detail's uuid as
        # TaskFlow does): a resumed run must never read replies meant for an
        # earlier engine working on the same flow detail.
        return executor.WorkerTaskExecutor(
            uuid=uuidlib.uuid4().hex,
            exchange=options.get("exchange") or DEFAULT_EXCHANGE,
            topics=list(topics),
            transition_timeout=options.get("transition_timeout", pr.REQUEST_TIMEOUT_S),
            url=options.get("url"),
            transport=options.get("transport"),
            transport_options=options.get("transport_options"),
            retry_options=options.get("retry_options"),
            worker_expiry=options.get("worker_expiry", pr.EXPIRES_AFTER_S),
            root_id=flow_uuid, parent_id=flow_uuid)
