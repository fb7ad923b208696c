"""What ``flowengine worker`` sets up around the worker: logging, pid file, handlers, metrics."""

from __future__ import annotations

import argparse
import errno
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowengine.engines.worker_based.messaging.settings import BrokerSettings
    from flowengine.engines.worker_based.worker_side.settings import WorkerSettings

#: --loglevel names accepted (any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

#: Log line format of the worker (its log is read by operators and tools).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class SetupError(Exception):
    """A worker option cannot be honoured (the message says which and why)."""


def log_level(name: str | None, verbose: bool) -> int:
    """The level ``--loglevel``/``-v`` ask for (INFO by default: a daemon's log)."""
    if verbose:
        return logging.DEBUG
    if name is None:
        return logging.INFO
    upper = name.upper()
    if upper not in LOG_LEVELS:
        raise SetupError(f"--loglevel {name}: expected one of {', '.join(LOG_LEVELS)}")
    level: int = getattr(logging, upper)
    return level


def configure_logging(level: int, logfile: str | None) -> None:
    """Log at ``level`` to stderr, or appending to ``logfile`` (SetupError: cannot open it)."""
    handler: logging.Handler
    if logfile is None:
        handler = logging.StreamHandler()
    else:
        try:
            handler = logging.FileHandler(logfile, encoding="utf-8")
        except OSError as e:
            raise SetupError(f"--logfile {logfile}: {e.strerror or e}") from e
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


class PidFile:
    """Writes this process's pid to ``path`` while it runs; refuses a live one's file.

    A file left by a process that is gone (a crash, kill -9) is replaced.
    SetupError names the running process or why the file cannot be written.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._written = False

    def __enter__(self) -> PidFile:
        try:
            with open(self.path, encoding="utf-8") as fh:
                text = fh.read().strip()
        except FileNotFoundError:
            text = ""
        except OSError as e:
            raise SetupError(f"--pidfile {self.path}: {e.strerror or e}") from e
        if text:
            try:
                other = int(text)
            except ValueError:
                raise SetupError(
                    f"--pidfile {self.path} holds {text[:20]!r}, not a pid:"
                    f" remove it if no worker uses it"
                ) from None
            if other != os.getpid() and _alive(other):
                raise SetupError(
                    f"--pidfile {self.path}: process {other} is running with it (another worker?)"
                )
            os.unlink(self.path)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            if e.errno == errno.EEXIST:
                raise SetupError(f"--pidfile {self.path}: another process just created it") from e
            raise SetupError(f"--pidfile {self.path}: {e.strerror or e}") from e
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()}\n")
        self._written = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._written:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def exception_handlers(specs: Sequence[str]) -> list[Any]:
    """The handlers ``--exception-handler module:func`` name; SetupError naming a bad one."""
    from flowengine.commands import loading
    from flowengine.engines.worker_based.worker_side import exception_handlers as eh

    loading.make_cwd_importable()
    handlers = []
    for spec in specs:
        try:
            handlers.append(eh.load_handler(spec))
        except (ImportError, ValueError) as e:
            raise SetupError(f"--exception-handler {spec}: {e}") from e
    return handlers


def broker_settings(args: argparse.Namespace, secret: Any) -> BrokerSettings:
    """The broker ``flowengine worker``'s options name (``secret``: the keys read)."""
    from flowengine.engines.worker_based.messaging.settings import BrokerSettings

    return BrokerSettings(
        args.url,
        args.transport,
        dict(args.transport_options),
        None,
        durable=args.durable,
        secret=secret,
        compat=args.compat,  # mixed fleets with TaskFlow
        max_body_bytes=args.max_body_bytes,
        max_redeliveries=args.max_redeliveries,
        queue_type=args.queue_type,
        failover_strategy=args.failover_strategy,
    )


def worker_settings(
    args: argparse.Namespace, handlers: Sequence[Any], metrics: Any
) -> WorkerSettings:
    """The worker settings ``flowengine worker``'s options ask for (ValueError: a bad one)."""
    from flowengine.engines.worker_based.worker_side.settings import WorkerSettings

    # --heartbeat-interval absent: the settings' default, said in one place.
    interval = (
        {} if args.heartbeat_interval is None else {"heartbeat_interval": args.heartbeat_interval}
    )
    return WorkerSettings(
        events=args.events,
        soft_time_limit=args.soft_time_limit,
        time_limit=args.time_limit,
        exception_handlers=tuple(handlers),
        metrics=metrics,
        **interval,
    )
