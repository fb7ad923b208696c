"""What the dashboard's buttons do: the CLI's own code paths, called for an authenticated user.

Each action is the command a person would type, through the same
functions: ``cancel`` is ``flowengine control cancel``, ``shutdown`` is
``flowengine control shutdown`` (warm), ``requeue`` is ``flowengine
deadletters requeue --index N --yes``, ``retry``/``resume`` start
``flowengine flows retry|resume`` as a process of their own (a flow runs
as long as it runs; the page shows its progress from the backend). Control
messages go through a :class:`ControlClient` over the dashboard's broker
settings, so they are signed with the same keys as the CLI's when signing is
on (``--secret-file``, ``FLOWENGINE_SECRET_FILE``, ``FLOWENGINE_SECRET``).

Every action is logged with who asked (token id or user, and address), what,
and how it ended.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

from flowengine.commands.errors import CommandError

LOG = logging.getLogger(__name__)

#: Seconds an action waits for the workers' answers: as `flowengine control`'s --timeout.
ANSWER_TIMEOUT_S = 1.0

#: Actions the page may ask for, with the fields each needs.
FIELDS = {
    "cancel": ("request",),
    "shutdown": ("worker",),
    "requeue": ("queue", "index"),
    "retry": ("flow",),
    "resume": ("flow",),
}


class ActionRefused(Exception):
    """The action cannot be done as asked (says why); nothing was changed."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What an action did, as the page shows it."""

    message: str
    details: Any = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"ok": True, "message": self.message, "details": self.details}


class Actions:
    """Carries out actions on the workers of ``exchange`` and the flows of ``flows``."""

    def __init__(
        self, exchange: str, broker: Any, flows: Any = None, secret_file: str | None = None
    ) -> None:
        self._exchange = exchange
        self._broker = broker
        self._flows = flows
        self._secret_file = secret_file

    def run(self, name: str, fields: Mapping[str, Any], who: str) -> Outcome:
        """Do action ``name`` for ``who``; ActionRefused when it cannot be done."""
        if name not in FIELDS:
            raise ActionRefused(f"unknown action {name!r} (one of {', '.join(FIELDS)})", 404)
        missing = [f for f in FIELDS[name] if fields.get(f) in (None, "")]
        if missing:
            raise ActionRefused(f"action {name} needs {', '.join(missing)}", 400)
        what = ", ".join(f"{f}={fields[f]}" for f in FIELDS[name])
        try:
            outcome: Outcome = getattr(self, f"_{name}")(fields)
        except ActionRefused as e:
            LOG.warning("Dashboard action %s (%s) by %s refused: %s", name, what, who, e)
            raise
        except CommandError as e:
            LOG.warning("Dashboard action %s (%s) by %s refused: %s", name, what, who, e)
            raise ActionRefused(str(e)) from e
        LOG.warning("Dashboard action %s (%s) by %s: %s", name, what, who, outcome.message)
        return outcome

    def _client(self) -> Any:
        from flowengine.engines.worker_based.messaging.control_client import ControlClient

        return ControlClient(self._exchange, self._broker)

    def _cancel(self, fields: Mapping[str, Any]) -> Outcome:
        from flowengine.commands import inspect_cmd

        request = str(fields["request"])
        with self._client() as client:
            answers = inspect_cmd.cancel_request(client, request, ANSWER_TIMEOUT_S)
        if not answers:
            raise ActionRefused(_nobody(self._exchange), 504)
        return Outcome(inspect_cmd.describe_cancel(request, answers), answers)

    def _shutdown(self, fields: Mapping[str, Any]) -> Outcome:
        from flowengine.commands import inspect_cmd

        with self._client() as client:
            worker_id = inspect_cmd.pick_worker(client, str(fields["worker"]), ANSWER_TIMEOUT_S)
            answers = inspect_cmd.shutdown_worker(client, worker_id, ANSWER_TIMEOUT_S)
        if not answers:
            raise ActionRefused(_nobody(self._exchange), 504)
        return Outcome(inspect_cmd.describe_shutdown(worker_id, answers), answers)

    def _requeue(self, fields: Mapping[str, Any]) -> Outcome:
        from flowengine.commands import deadletters_cmd
        from flowengine.engines.worker_based.messaging import dead_letter_reader as dlr
        from flowengine.engines.worker_based.messaging import inventory

        queue = str(fields["queue"])
        try:
            index = int(fields["index"])
            if index < 1:
                raise ValueError(index)
            dlr.check_name(queue)
            deadletters_cmd.check_requeue(self._broker, self._exchange, queue, [index])
        except ValueError:
            raise ActionRefused(
                f"index {fields['index']!r} is not a dead letter's number (1 is the oldest)", 400
            ) from None
        except (dlr.NotADeadLetterQueue, inventory.QueueNotFound) as e:
            raise ActionRefused(str(e)) from e
        done, problems, complete = deadletters_cmd.requeue(
            self._broker, self._exchange, queue, [index]
        )
        if not complete:
            raise ActionRefused("; ".join(problems))
        return Outcome(" ".join(done[:-1]) or done[-1], problems)

    def _retry(self, fields: Mapping[str, Any]) -> Outcome:
        from flowengine.commands.flows import retry_cmd

        fd = self._flow(fields)
        retry_cmd.check_retriable(fd)
        return self._rerun("retry", fd)

    def _resume(self, fields: Mapping[str, Any]) -> Outcome:
        from flowengine.commands.flows import resume_cmd

        fd = self._flow(fields)
        resume_cmd.check_resumable(fd, force=False)
        return self._rerun("resume", fd)

    def _flow(self, fields: Mapping[str, Any]) -> Any:
        if self._flows is None:
            raise ActionRefused("no --backend: the dashboard knows no flows", 404)
        return self._flows.find(str(fields["flow"]))

    def _rerun(self, command: str, fd: Any) -> Outcome:
        """Start ``flowengine flows retry|resume`` on ``fd``, on the engine it last ran on."""
        from flowengine.commands import backend_url
        from flowengine.engines.worker_based.wire import signing
        from flowengine.persistence import run_records

        records = run_records.of(fd)
        engine = str(records.get("engine") or "serial")
        argv = [
            sys.executable,
            "-m",
            "flowengine",
            "flows",
            command,
            fd.uuid,
            "--no-progress",
            "--engine",
            engine,
        ]
        from flowengine.dashboard import auth

        # The dashboard's own credentials are none of the command's business.
        env = {
            k: v for k, v in os.environ.items() if k not in (auth.TOKEN_ENV, auth.BASIC_AUTH_ENV)
        }
        # The backend URL and broker URL may hold passwords: the environment, not argv.
        env[backend_url.BACKEND_ENV] = self._flows.raw_url
        if engine == "worker-based":
            topics = records.get("topics") or []
            if not topics:
                raise ActionRefused(
                    f"flow {fd.uuid[:8]} records no worker topics (it ran"
                    f" before they were recorded): use `flowengine flows"
                    f" {command}` with --topic"
                )
            argv += ["--exchange", str(records.get("exchange") or self._exchange)]
            for topic in topics:
                argv += ["--topic", str(topic)]
            argv += _broker_args(self._broker, env)
            if self._secret_file is not None:
                env[signing.SECRET_FILE_ENV] = self._secret_file
        # Its own session: stopping the dashboard does not stop the flow. Its
        # output (the run's summary) goes to the dashboard's stderr, beside the log.
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        threading.Thread(
            target=self._reap,
            args=(child, command, fd.uuid),
            daemon=True,
            name=f"flowengine-dashboard-{command}-{fd.uuid[:8]}",
        ).start()
        return Outcome(
            f"flowengine flows {command} {fd.uuid[:8]} started (pid {child.pid},"
            f" {engine} engine): the flow's state shows its progress",
            {"pid": child.pid},
        )

    @staticmethod
    def _reap(child: subprocess.Popen[bytes], command: str, flow: str) -> None:
        code = child.wait()
        LOG.warning(
            "flowengine flows %s %s (pid %d) exited with status %d",
            command,
            flow[:8],
            child.pid,
            code,
        )


def _broker_args(broker: Any, env: dict[str, str]) -> list[str]:
    """The worker-based engine's broker options of ``flows retry|resume`` (no URL in argv)."""
    import json

    from flowengine.commands import env_urls

    args: list[str] = []
    env.pop(env_urls.BROKER_ENV, None)
    if broker.url:
        # Read from there only when no --transport is given (env_urls.fill).
        env[env_urls.BROKER_ENV] = broker.url
    elif broker.transport:
        args += ["--transport", str(broker.transport)]
    for key, value in broker.transport_options.items():
        args += ["--transport-option", f"{key}={json.dumps(value)}"]
    return args


def _nobody(exchange: str) -> str:
    return (
        f"no worker answered within {ANSWER_TIMEOUT_S:g} s on exchange {exchange!r}"
        f" (none runs there, or they refuse this dashboard's messages: signed"
        f" with other keys?)"
    )
