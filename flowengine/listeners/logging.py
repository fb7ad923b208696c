"""Listeners that write transitions to a :mod:`logging` logger."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable
from typing import Any

from flowengine import states
from flowengine.formatters import FailureFormatter
from flowengine.listeners import base
from flowengine.types import failure
from flowengine.utils import misc

LOG = logging.getLogger(__name__)


class LoggingListener(base.DumpingListener):
    """Logs every flow and task transition at one level (``logging.DEBUG`` by default)."""

    #: Logger used when none is given to the constructor (None: this module's).
    _LOGGER: logging.Logger | None = None

    def __init__(
        self,
        engine: Any,
        task_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        log: logging.Logger | None = None,
        level: int = logging.DEBUG,
    ) -> None:
        super().__init__(
            engine,
            task_listen_for=task_listen_for,
            flow_listen_for=flow_listen_for,
            retry_listen_for=retry_listen_for,
        )
        self._logger = misc.pick_first_not_none(log, self._LOGGER, LOG)
        self._level = level

    def _dump(self, message: str, *args: Any, **kwargs: Any) -> None:
        self._logger.log(self._level, message, *args, **kwargs)


class DynamicLoggingListener(base.Listener):
    """Logs transitions at ``level``, or at ``failure_level`` for failures and reverts.

    Flow FAILURE/REVERTED and task FAILURE/REVERTED/RETRYING/REVERT_FAILURE
    use ``failure_level``; a task whose result is a Failure always does, with
    its traceback and the atoms that ran before it.
    """

    #: Logger used when none is given to the constructor (None: this module's).
    _LOGGER: logging.Logger | None = None

    #: States reached because something failed.
    _FAILURE_STATES = (states.FAILURE, states.REVERT_FAILURE)

    def __init__(
        self,
        engine: Any,
        task_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        log: logging.Logger | None = None,
        failure_level: int = logging.WARNING,
        level: int = logging.DEBUG,
        hide_inputs_outputs_of: Iterable[str] = (),
        fail_formatter: Any = None,
        mask_inputs_keys: Iterable[str] = (),
        mask_outputs_keys: Iterable[str] = (),
    ) -> None:
        super().__init__(
            engine,
            task_listen_for=task_listen_for,
            flow_listen_for=flow_listen_for,
            retry_listen_for=retry_listen_for,
        )
        self._failure_level = failure_level
        self._level = level
        self._task_log_levels = {
            states.FAILURE: failure_level,
            states.REVERTED: failure_level,
            states.RETRYING: failure_level,
            states.REVERT_FAILURE: failure_level,
        }
        self._flow_log_levels = {
            states.FAILURE: failure_level,
            states.REVERTED: failure_level,
        }
        self._hide_inputs_outputs_of = frozenset(hide_inputs_outputs_of)
        self._logger = misc.pick_first_not_none(log, self._LOGGER, LOG)
        if fail_formatter is None:
            fail_formatter = FailureFormatter(
                engine,
                hide_inputs_outputs_of=self._hide_inputs_outputs_of,
                mask_inputs_keys=mask_inputs_keys,
                mask_outputs_keys=mask_outputs_keys,
            )
        self._fail_formatter = fail_formatter

    def _flow_receiver(self, state: str, details: dict[str, Any]) -> None:
        level = self._flow_log_levels.get(state, self._level)
        self._logger.log(
            level,
            "Flow '%s' (%s) transitioned into state '%s' from state '%s'",
            details["flow_name"],
            details["flow_uuid"],
            state,
            details.get("old_state"),
        )

    def _task_receiver(self, state: str, details: dict[str, Any]) -> None:
        task_name = details["task_name"]
        task_uuid = details["task_uuid"]
        old_state = details["old_state"]
        if "result" not in details or state not in base.FINISH_STATES:
            # An intermediate state: no result to show.
            level = self._task_log_levels.get(state, self._level)
            self._logger.log(
                level,
                "Task '%s' (%s) transitioned into state '%s' from state '%s'",
                task_name,
                task_uuid,
                state,
                old_state,
            )
            return
        result = details["result"]
        if isinstance(result, failure.Failure):
            if not self._logger.isEnabledFor(self._failure_level):
                # Nothing would be written: skip walking the graph and storage.
                return
            # A matcher, as TaskFlow passes it: a formatter written for
            # TaskFlow (fail_formatter=) understands nothing else.
            exc_info, fail_details = self._fail_formatter.format(
                result, functools.partial(_is_atom_named, task_name)
            )
            if fail_details:
                self._logger.log(
                    self._failure_level,
                    "Task '%s' (%s) transitioned into state '%s' from state '%s'%s%s",
                    task_name,
                    task_uuid,
                    state,
                    old_state,
                    os.linesep,
                    fail_details,
                    exc_info=exc_info,
                )
            else:
                self._logger.log(
                    self._failure_level,
                    "Task '%s' (%s) transitioned into state '%s' from state '%s'",
                    task_name,
                    task_uuid,
                    state,
                    old_state,
                    exc_info=exc_info,
                )
            return
        # Results may be large or sensitive: show them only when this
        # listener's own level is enabled (or the task failed), never for
        # tasks the caller asked to hide.
        level = self._task_log_levels.get(state, self._level)
        show_result = self._logger.isEnabledFor(self._level) or state == states.FAILURE
        if show_result and task_name not in self._hide_inputs_outputs_of:
            self._logger.log(
                level,
                "Task '%s' (%s) transitioned into state '%s' from state '%s' with result '%s'",
                task_name,
                task_uuid,
                state,
                old_state,
                result,
            )
        else:
            self._logger.log(
                level,
                "Task '%s' (%s) transitioned into state '%s' from state '%s'",
                task_name,
                task_uuid,
                state,
                old_state,
            )


def _is_atom_named(name: str, node: Any) -> bool:
    """Atom matcher for FailureFormatter.format: the hierarchy node of atom ``name``."""
    return getattr(node.item, "name", None) == name
