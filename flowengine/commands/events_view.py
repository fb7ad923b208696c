"""``flowengine events``: a live view of workers and requests, or raw JSON events."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from flowengine.commands import broker_options

#: Seconds between screen refreshes: smooth enough to watch, cheap to draw.
REFRESH_PERIOD_S = 0.25

#: Requests shown (the most recently active): a screenful.
MAX_REQUESTS_SHOWN = 20

#: Requests remembered; older finished ones are forgotten (bounded memory).
MAX_REQUESTS_KEPT = 1000

#: Seconds without any event before the command says why it may see none:
#: a worker started with --events heartbeats every 2 s, so this much silence
#: means no such worker is on the exchange.
QUIET_NOTICE_S = 10.0

#: Seconds to wait for the event queue to be consumed before drawing the view
#: anyway (a slow broker); a broker that refuses ends the wait at once.
READY_TIMEOUT_S = 30.0

#: Seconds between checks, while waiting for the view to start, of whether
#: the receiver has already failed.
READY_POLL_S = 0.05

#: Heartbeats a worker may miss before it is shown as lost.
MISSED_HEARTBEATS_LOST = 3

#: Request state shown for each task event type.
STATE_OF_EVENT = {
    "task-received": "RECEIVED",
    "task-started": "STARTED",
    "task-progress": "STARTED",
    "task-succeeded": "SUCCESS",
    "task-failed": "FAILURE",
    "task-expired": "EXPIRED",
    "task-retried": "RETRIED",
}


class WorkerView:
    """What the view knows about one worker."""

    __slots__ = (
        "hostname",
        "topic",
        "online",
        "active",
        "processed",
        "running",
        "last_heard",
        "freq",
    )

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self.topic = ""
        self.online = True
        self.active = 0
        self.processed = 0
        self.running: set[str] = set()
        self.last_heard = 0.0
        self.freq = 2.0

    def status(self, now: float) -> str:
        """online/busy/lost/offline as of ``now`` (epoch seconds)."""
        if not self.online:
            return "offline"
        if now - self.last_heard > MISSED_HEARTBEATS_LOST * self.freq:
            return "lost"
        return "busy" if self.running else "idle"


class RequestView:
    """What the view knows about one request."""

    __slots__ = (
        "uuid",
        "name",
        "state",
        "worker",
        "attempt",
        "runtime",
        "progress",
        "started",
        "updated",
    )

    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
        self.name = "?"
        self.state = "?"
        self.worker = ""
        self.attempt = 0
        self.runtime: float | None = None
        self.progress: float | None = None
        self.started: float | None = None
        self.updated = 0.0


class EventsState:
    """Workers and requests, rebuilt from the events seen so far (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: dict[str, WorkerView] = {}
        self.requests: OrderedDict[str, RequestView] = OrderedDict()
        self.flows: dict[str, str] = {}
        self.count = 0

    def apply(self, event: dict[str, Any]) -> None:
        """Take one event into account."""
        kind = event.get("type", "")
        with self.lock:
            self.count += 1
            if kind.startswith("worker-"):
                self._worker_event(kind, event)
            elif kind.startswith("task-") and event.get("uuid"):
                self._task_event(kind, event)
            elif kind.startswith("flow-") and event.get("root_id"):
                self.flows[event["root_id"]] = (
                    f"{event.get('flow_name', '?')}: {event.get('state', kind)}"
                )

    def _worker(self, event: dict[str, Any]) -> WorkerView:
        name = str(event.get("hostname", "?"))
        worker = self.workers.get(name)
        if worker is None:
            worker = self.workers[name] = WorkerView(name)
        worker.last_heard = float(event.get("timestamp") or time.time())
        return worker

    def _worker_event(self, kind: str, event: dict[str, Any]) -> None:
        worker = self._worker(event)
        worker.topic = event.get("topic", worker.topic)
        worker.active = int(event.get("active", worker.active) or 0)
        worker.processed = int(event.get("processed", worker.processed) or 0)
        worker.freq = float(event.get("freq", worker.freq) or worker.freq)
        worker.online = kind != "worker-offline"
        if kind == "worker-heartbeat" and "running" in event:
            worker.running = set(event["running"])

    def _task_event(self, kind: str, event: dict[str, Any]) -> None:
        uuid = event["uuid"]
        request = self.requests.pop(uuid, None) or RequestView(uuid)
        self.requests[uuid] = request  # most recently active last
        request.name = event.get("name") or request.name
        request.state = STATE_OF_EVENT.get(kind, request.state)
        request.attempt = int(event.get("attempt") or request.attempt)
        request.updated = float(event.get("timestamp") or time.time())
        if event.get("started"):
            request.started = float(event["started"])
        if event.get("runtime") is not None:
            request.runtime = float(event["runtime"])
        if kind == "task-progress" and event.get("progress") is not None:
            request.progress = float(event["progress"])
        if event.get("hostname") and not kind == "task-retried":
            request.worker = str(event["hostname"])
            worker = self._worker(event)
            if kind in ("task-received", "task-started", "task-progress"):
                worker.running.add(uuid)
            else:
                worker.running.discard(uuid)
            if event.get("processed") is not None:  # a task's end carries the count
                worker.processed = int(event["processed"])
        while len(self.requests) > MAX_REQUESTS_KEPT:
            self.requests.popitem(last=False)


def render(state: EventsState, source: str, unverified: int = 0) -> Any:
    """A rich renderable of ``state``: a workers table above a requests table.

    ``unverified``: events dropped for a missing or wrong signature, shown in
    the header when there were any.
    """
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    now = time.time()
    with state.lock:
        workers = sorted(state.workers.values(), key=lambda w: w.hostname)
        requests = list(state.requests.values())[-MAX_REQUESTS_SHOWN:]
        count = len(state.requests)
        events = state.count
        flows = list(state.flows.items())[-3:]
        dropped = f", {unverified} unverified dropped" if unverified else ""
        header = Text(
            f"flowengine events - {source} - {events} events{dropped},"
            f" {len(workers)} workers, {count} requests",
            style="bold",
        )
        wtable = Table(title="Workers", expand=True, title_justify="left")
        for column in (
            "worker",
            "topic",
            "status",
            "active",
            "processed",
            "running",
            "last heartbeat",
        ):
            wtable.add_column(column)
        colours = {"idle": "green", "busy": "yellow", "lost": "red", "offline": "dim"}
        for w in workers:
            status = w.status(now)
            names = sorted(
                state.requests[u].name if u in state.requests else _short(u) for u in w.running
            )
            running = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "") or "-"
            wtable.add_row(
                w.hostname,
                w.topic,
                Text(status, style=colours[status]),
                str(len(w.running)),
                str(w.processed),
                running,
                f"{max(0.0, now - w.last_heard):.1f} s ago",
            )
        rtable = Table(title="Requests", expand=True, title_justify="left")
        for column in ("request", "task", "state", "worker", "attempt", "runtime"):
            rtable.add_column(column)
        scolours = {
            "SUCCESS": "green",
            "FAILURE": "red",
            "STARTED": "yellow",
            "EXPIRED": "magenta",
            "RECEIVED": "cyan",
        }
        for r in reversed(requests):
            runtime = (
                f"{r.runtime:.3f} s"
                if r.runtime is not None
                else f"{now - r.started:.1f} s..."
                if r.started
                else "-"
            )
            shown = (
                r.state
                if r.progress is None or r.state != "STARTED"
                else f"STARTED {r.progress:.0%}"
            )
            rtable.add_row(
                _short(r.uuid),
                r.name,
                Text(shown, style=scolours.get(r.state, "")),
                r.worker,
                str(r.attempt),
                runtime,
            )
    parts: list[Any] = [header, wtable, rtable]
    for root_id, text in flows:
        parts.append(Text(f"flow {_short(root_id)} {text}"))
    return Group(*parts)


def _short(uuid: str) -> str:
    return uuid[:8]


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add the ``events`` subcommand to the ``flowengine`` parser."""
    p = sub.add_parser("events", help="watch workers and requests live (or --json)")
    p.add_argument(
        "--url", default=None, help="broker URL (kombu format; default: $FLOWENGINE_BROKER_URL)"
    )
    p.add_argument(
        "--exchange",
        default="default",
        help="task exchange whose events to follow (default: 'default')",
    )
    p.add_argument("--transport", default=None, help="kombu transport name")
    p.add_argument(
        "--transport-option",
        dest="transport_options",
        default=[],
        action="append",
        type=parse_option,
        metavar="KEY=VALUE",
        help="transport option (repeatable; values parsed as JSON)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print each event as one JSON line on stdout, nothing else",
    )
    p.add_argument(
        "--secret-file",
        default=None,
        metavar="PATH",
        help="file of shared signing keys, one a line: show only events"
        " signed with one of them (default: $FLOWENGINE_SECRET_FILE/"
        "$FLOWENGINE_SECRET; neither set: show every event, unverified)",
    )


def _keyring(secret_file: str | None) -> Any:
    """The keys to verify events with, as ``flowengine worker`` finds its own.

    ``--secret-file`` first, then the environment; None when neither gives a
    key. Raises OSError (unreadable file) or ValueError (no key, or one too short).
    """
    from flowengine.engines.worker_based.wire import signing

    if secret_file is None:
        return signing.load_keyring(None)
    keys = signing.read_key_file(secret_file)
    if not keys:
        raise ValueError(f"key file {secret_file} holds no key")
    return signing.load_keyring(keys)


def run(args: argparse.Namespace) -> int:
    """Follow the event stream until SIGINT/SIGTERM."""
    from flowengine import exceptions as exc
    from flowengine.engines.worker_based import events as ev
    from flowengine.engines.worker_based.transports import errors as broker_errors

    try:
        keyring = _keyring(args.secret_file)
    except (OSError, ValueError) as e:
        print(f"flowengine events: cannot read the signing keys: {e}", file=sys.stderr)
        return 2
    # memory:// would show an empty view for ever: no worker can publish there.
    broker_errors.check_shared(
        args.url, args.transport, "the workers whose events it shows are other processes"
    )
    stop = threading.Event()
    state = EventsState()
    if args.json:

        def handle(event: dict[str, Any]) -> None:
            sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
            sys.stdout.flush()
    else:
        handle = state.apply
    heard = threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        heard.set()
        handle(event)

    receiver = ev.EventReceiver(
        args.exchange,
        on_event,
        url=args.url,
        transport=args.transport,
        transport_options=dict(args.transport_options) or None,
        secret=keyring,
    )
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            receiver.run()
        except BaseException as e:  # shown by the main thread
            errors.append(e)
        finally:
            stop.set()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=consume, name="flowengine-events", daemon=True)
    thread.start()
    # Shown on screen (and in screenshots): never with the URL's password.
    source = broker_options.where(args)
    if _wait_ready(receiver, stop, READY_TIMEOUT_S):
        # On stderr: stdout stays pure JSON with --json.
        checked = (
            ""
            if keyring is None
            else f"; verifying signatures (key ids {', '.join(keyring.key_ids)})"
        )
        print(
            f"Listening for events on {ev.events_exchange_name(args.exchange)}{checked}",
            file=sys.stderr,
            flush=True,
        )
        threading.Thread(
            target=_notice_silence,
            args=(heard, stop, args.exchange),
            name="flowengine-events-quiet",
            daemon=True,
        ).start()
    try:
        if errors:
            pass  # the receiver failed before consuming: no empty view, just why
        elif args.json:
            stop.wait()
        else:
            _live(state, source, stop, lambda: receiver.unverified_count)
    finally:
        receiver.stop()
        thread.join(5.0)
    if errors:
        error = errors[0]
        if not isinstance(error, exc.FlowEngineError):
            error = broker_errors.classify(
                error, broker_options.broker_uri(args), args.exchange, durable=False
            )
        print(f"flowengine events: {error}", file=sys.stderr)
        return 1
    return 0


def _wait_ready(receiver: Any, stop: threading.Event, timeout_s: float) -> bool:
    """Wait until ``receiver`` consumes; False once ``stop`` is set or ``timeout_s`` passed.

    ``stop`` is set when the receiving thread ends: a receiver that failed
    before it could even connect (a malformed URL, an unknown transport)
    must end the wait at once, not after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        if receiver.wait_ready(min(READY_POLL_S, max(0.0, deadline - time.monotonic()))):
            return True
        if time.monotonic() >= deadline:
            return False
    return False


def _notice_silence(
    heard: threading.Event, stop: threading.Event, exchange: str, after_s: float = QUIET_NOTICE_S
) -> None:
    """Say once, on stderr, why nothing shows when no event came in ``after_s``."""
    if not heard.wait(after_s) and not stop.is_set():
        print(
            f"flowengine events: no event in {after_s:.0f} s: no worker on"
            f" exchange {exchange!r} was started with --events (flowengine worker"
            f" --events ...), or the URL/exchange is not the workers' one",
            file=sys.stderr,
            flush=True,
        )


def _live(
    state: EventsState, source: str, stop: threading.Event, unverified: Callable[[], int]
) -> None:
    """Redraw the view in place until ``stop`` is set."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    with Live(
        render(state, source, unverified()), console=console, auto_refresh=False, transient=False
    ) as live:
        while not stop.wait(REFRESH_PERIOD_S):
            live.update(render(state, source, unverified()), refresh=True)
        live.update(render(state, source, unverified()), refresh=True)
