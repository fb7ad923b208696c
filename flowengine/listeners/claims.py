"""A listener that suspends an engine once its job's claim is gone (TaskFlow's).

flowengine's own conductors do not need it on their boards (the lease
keeper reports a lost claim at once); it serves boards without one, and
programs that run engines for jobs by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flowengine import exceptions, states
from flowengine.listeners import base

__all__ = ["CheckingClaimListener"]

LOG = logging.getLogger(__name__)


class CheckingClaimListener(base.Listener):
    """On every flow or task state change, checks the job is still claimed by ``owner``.

    When it is not, ``on_job_loss(engine, state, details)`` runs (default:
    suspend the engine). ValueError if ``on_job_loss`` is not callable. Each
    check asks the board, so it costs a round trip per state change.
    """

    def __init__(
        self,
        engine: Any,
        job: Any,
        board: Any,
        owner: str,
        on_job_loss: Callable[[Any, str, Any], Any] | None = None,
    ) -> None:
        super().__init__(engine)
        self._job = job
        self._board = board
        self._owner = owner
        self._on_job_loss: Callable[[Any, str, Any], Any]
        if on_job_loss is None:
            self._on_job_loss = self._suspend_engine_on_loss
        elif not callable(on_job_loss):
            raise ValueError("Custom 'on_job_loss' handler must be callable")
        else:
            self._on_job_loss = on_job_loss

    def _suspend_engine_on_loss(self, engine: Any, state: str, details: Any) -> None:
        """The default reaction to a lost claim: suspend the engine."""
        try:
            engine.suspend()
        except exceptions.TaskFlowException as e:
            LOG.warning(
                "Failed suspending engine '%s' (previously owned by '%s'): %s",
                engine,
                self._owner,
                e.pformat(),
            )

    def _flow_receiver(self, state: str, details: Any) -> None:
        self._claim_checker(state, details)

    def _task_receiver(self, state: str, details: Any) -> None:
        self._claim_checker(state, details)

    def _has_been_lost(self) -> bool:
        try:
            job_state = self._job.state
            job_owner = self._board.find_owner(self._job)
        except (exceptions.NotFound, exceptions.JobFailure):
            return True
        return bool(job_state == states.UNCLAIMED or self._owner != job_owner)

    def _claim_checker(self, state: str, details: Any) -> None:
        if not self._has_been_lost():
            LOG.debug("Job '%s' is still claimed (actively owned by '%s')", self._job, self._owner)
            return
        LOG.warning(
            "Job '%s' has lost its claim (previously owned by '%s')", self._job, self._owner
        )
        self._on_job_loss(self._engine, state, details)
