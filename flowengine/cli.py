"""The ``flowengine`` command: run a worker, or run the demo end to end."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from typing import Any

from flowengine import __version__, commands
from flowengine import exceptions as exc
from flowengine.commands import env_urls
from flowengine.engines.worker_based.wire.names import MAX_BODY_BYTES
from flowengine.utils import gc_freeze

LOG = logging.getLogger("flowengine.cli")

# Exchange and topic the demo's workers and engine meet on.
DEMO_EXCHANGE = "flowengine-demo"
DEMO_TOPIC = "demo"

# kombu transport the demo uses when no --url is given: flowengine's
# filesystem transport (whole messages, delivered in order; no server needed).
DEMO_TRANSPORT = "filesystem"

# Seconds the demo waits for its worker processes to announce themselves:
# a cold Python start plus imports takes ~1 s; 30 s covers a loaded machine.
DEMO_WORKER_START_TIMEOUT_S = 30.0

# Seconds a stopped worker process gets to exit after SIGTERM before it is
# killed (a warm shutdown only finishes what is running; the demo's tasks are tiny).
DEMO_WORKER_STOP_TIMEOUT_S = 10.0

# Seconds the demo flow may take before the demo gives up (it normally takes
# well under a second; this only bounds a broken setup).
DEMO_RUN_TIMEOUT_S = 120.0


def _parse_option(text: str) -> tuple[str, Any]:
    """Parse ``key=value``; the value is read as JSON when it is valid JSON."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowengine", description="flowengine: TaskFlow-compatible workflow engine."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    worker = sub.add_parser("worker", help="run a worker until SIGINT/SIGTERM")
    worker.add_argument(
        "--url", default=None, help="broker URL (kombu format; default: $FLOWENGINE_BROKER_URL)"
    )
    worker.add_argument("--exchange", required=True, help="exchange name")
    worker.add_argument(
        "--topic",
        required=True,
        action="append",
        help="topic this worker consumes (repeatable: several topics, the"
        " first one's requests taken first when several have work)",
    )
    worker.add_argument(
        "--tasks",
        required=True,
        nargs="+",
        action="extend",
        metavar="module[:Class]",
        help="modules or task classes this worker may run",
    )
    worker.add_argument(
        "--threads",
        "--concurrency",
        dest="threads",
        type=int,
        default=None,
        help="how many requests run at once",
    )
    worker.add_argument(
        "--executor",
        default="threads",
        choices=["threads", "thread", "processes", "process"],
        help="where task bodies run: pool threads (default), or a child"
        " process forked per task (hard time limits kill it)",
    )
    worker.add_argument(
        "--soft-time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="default soft limit: SoftTimeLimitExceeded is raised in the task",
    )
    worker.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="default hard limit: the task is stopped and fails",
    )
    worker.add_argument("--transport", default=None, help="kombu transport name")
    worker.add_argument(
        "--transport-option",
        dest="transport_options",
        default=[],
        action="append",
        type=_parse_option,
        metavar="KEY=VALUE",
        help="transport option (repeatable; values parsed as JSON)",
    )
    worker.add_argument(
        "--durable",
        action="store_true",
        help="durable exchange/queues and persistent messages (every"
        " executor on the exchange must agree)",
    )
    worker.add_argument(
        "--failover-strategy",
        default="round-robin",
        choices=["round-robin", "shuffle"],
        help="order in which the URLs of a failover list (--url"
        " 'amqp://h1//;amqp://h2//') are tried (default round-robin)",
    )
    worker.add_argument(
        "--queue-type",
        default="classic",
        choices=["classic", "quorum"],
        help="RabbitMQ queue type: quorum (with --durable) replicates the"
        " queues across a cluster's nodes (every executor on the"
        " exchange must agree; default classic)",
    )
    worker.add_argument(
        "--secret-file",
        default=None,
        metavar="PATH",
        help="file of shared signing keys, one a line, the signing key"
        " first (default: $FLOWENGINE_SECRET_FILE/$FLOWENGINE_SECRET)",
    )
    worker.add_argument(
        "--heartbeat-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between heartbeats of each held request (default 2;"
        " executors declare it lost after 3 missed ones)",
    )
    worker.add_argument(
        "--max-body-bytes",
        type=int,
        default=MAX_BODY_BYTES,
        metavar="BYTES",
        help="largest message body taken; a larger request is refused"
        f" with a FAILURE and dead-lettered (default {MAX_BODY_BYTES})",
    )
    worker.add_argument(
        "--max-redeliveries",
        type=int,
        default=3,
        metavar="N",
        help="times a message may be in hand when a consume loop fails"
        " before it is dead-lettered unread (default 3)",
    )
    worker.add_argument(
        "--compat",
        default=None,
        choices=["taskflow"],
        help="share the exchange with TaskFlow engines/workers: declare"
        " what TaskFlow declares (see the migration guide)",
    )
    worker.add_argument(
        "--loglevel",
        default=None,
        metavar="LEVEL",
        help="DEBUG, INFO (default), WARNING, ERROR or CRITICAL",
    )
    worker.add_argument(
        "--logfile",
        default=None,
        metavar="PATH",
        help="append the log to this file instead of stderr",
    )
    worker.add_argument(
        "--pidfile",
        default=None,
        metavar="PATH",
        help="write the pid here while running (refused while the pid it holds runs)",
    )
    worker.add_argument(
        "--exception-handler",
        dest="exception_handlers",
        default=[],
        action="append",
        metavar="module:function",
        help="called with each failed request before the default WARNING"
        " log line (repeatable; returning False stops the chain)",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on this port (needs pip install 'flowengine[metrics]')",
    )
    worker.add_argument(
        "--metrics-address",
        default=None,
        metavar="ADDRESS",
        help="address the metrics server listens on (default 0.0.0.0)",
    )

    demo = sub.add_parser("demo", help="run a sample flow on worker processes")
    demo.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    demo.add_argument(
        "--url",
        default=None,
        help="broker URL (redis://..., amqp://...); default: a temporary"
        " folder with the filesystem transport",
    )
    demo.add_argument(
        "--sources", type=int, default=None, help="width of the sample flow (8 gives 32 tasks)"
    )
    worker.add_argument(
        "--events",
        action="store_true",
        help="publish worker/task events on <exchange>.events (for"
        " `flowengine events`; off by default: it costs latency)",
    )
    commands.add_parsers(sub, _parse_option)  # events, graph, run
    for subparser in sub.choices.values():
        # `flowengine worker -v ...` as well as `flowengine -v worker ...`;
        # SUPPRESS keeps an absent sub-level flag from undoing the top-level one.
        subparser.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="log at DEBUG level",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flowengine`` console script; returns the exit code."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    problem = env_urls.fill(args)
    if problem:
        parser.error(problem)  # exit 2, as for any other missing argument
    # The command line owns its process: flowengine may tune its collector
    # (freeze the heap around runs; see utils/gc_freeze.py). A library host's is left alone.
    gc_freeze.allow_tuning()
    # A worker or conductor is a daemon: its INFO lines (requests served, reconnections)
    # are its log. The other commands talk to a person, who wants results
    # and warnings, not the engine's chatter.
    quiet = logging.INFO if args.command in ("worker", "conductor") else logging.WARNING
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else quiet,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        try:
            code = _dispatch(args)
            if sys.stdout is not None:  # None: started with stdout closed (>&-)
                sys.stdout.flush()  # a reader gone shows here, not at interpreter exit
            return code
        except BrokenPipeError:
            if not _stdout_closed():
                raise  # a socket's, not ours to hide
            return _end_on_closed_stdout()
    except KeyboardInterrupt:
        print(f"flowengine {args.command}: interrupted", file=sys.stderr)
        return 130
    except exc.MissingExtra as e:
        # Refused as asked (2), like a bad option: the same for every command
        # (the dashboard, --metrics-port, an SQL --backend) and not a failure
        # of the work itself (1).
        print(f"flowengine {args.command}: {_describe(e)}", file=sys.stderr)
        return 2
    except Exception as e:
        # Every mistake is one line; the traceback is there for -v.
        if args.verbose:
            traceback.print_exc()
        print(f"flowengine {args.command}: {_describe(e)}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "worker":
        return run_worker(args)
    if args.command in commands.COMMANDS:
        return commands.run(args)
    return run_demo(args)


#: Exit status when stdout's reader went away (``flowengine jobs list | head``):
#: Python's advice (see "Note on SIGPIPE" in the signal module's docs), and
#: what rich, which draws the tables of several commands, exits with then.
EXIT_STDOUT_CLOSED = 1


def _stdout_closed() -> bool:
    """Whether stdout is a pipe nobody reads any more."""
    if sys.stdout is None:
        return False
    try:
        sys.stdout.flush()  # what failed to go out is still buffered: it fails again
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        return False
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll(), or no real stdout
        return False


def _end_on_closed_stdout() -> int:
    """End quietly, as Unix tools do when their reader is gone (no error, no traceback)."""
    try:
        # Python flushes stdout once more at exit: let that go nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_STDOUT_CLOSED


def _describe(error: BaseException) -> str:
    """One line for ``error``: its message, its type when the message says nothing."""
    text = str(error).strip().splitlines()
    if not text:
        return type(error).__name__
    return (
        text[0]
        if isinstance(error, exc.FlowEngineError)
        else (f"{type(error).__name__}: {text[0]}")
    )


def run_worker(args: argparse.Namespace) -> int:
    """Run one worker in this process until SIGINT/SIGTERM."""
    from flowengine.commands import worker_setup
    from flowengine.engines.worker_based.transports import errors as broker_errors
    from flowengine.engines.worker_based.worker_side import shutdown
    from flowengine.engines.worker_based.worker_side import worker as wkr
    from flowengine.utils import threading_utils as tu

    broker_errors.check_shared(
        args.url, args.transport, "no engine in another process could reach this worker"
    )
    if len(set(args.topic)) != len(args.topic):
        print(f"flowengine worker: --topic given twice ({', '.join(args.topic)})", file=sys.stderr)
        return 2
    try:
        worker_setup.configure_logging(
            worker_setup.log_level(args.loglevel, args.verbose), args.logfile
        )
        task_classes = _task_classes(args.tasks)
        handlers = worker_setup.exception_handlers(args.exception_handlers)
    except (_NoTasks, worker_setup.SetupError) as e:
        print(f"flowengine worker: {e}", file=sys.stderr)
        return 2
    threads = args.threads if args.threads is not None else tu.get_optimal_thread_count()
    if threads < 1:
        print("flowengine worker: --threads must be at least 1", file=sys.stderr)
        return 2
    for option in ("soft_time_limit", "time_limit"):
        value = getattr(args, option)
        if value is not None and not value > 0:
            print(f"flowengine worker: --{option.replace('_', '-')} must be > 0", file=sys.stderr)
            return 2
    metrics = None
    if args.metrics_port is not None:
        from flowengine import metrics as metrics_mod

        metrics = metrics_mod.WorkerMetrics()
    worker = wkr.Worker(
        args.exchange,
        args.topic,
        task_classes,
        executor=args.executor,
        threads_count=threads,
        broker=worker_setup.broker_settings(args, _read_secret_file(args.secret_file)),
        settings=worker_setup.worker_settings(args, handlers, metrics),
    )
    if metrics is not None:
        from flowengine import metrics as metrics_mod

        metrics.watch(worker)
        address = args.metrics_address or metrics_mod.DEFAULT_ADDRESS
        try:
            metrics_mod.serve(args.metrics_port, metrics.registry, address)
        except OSError as e:
            print(
                f"flowengine worker: --metrics-port {args.metrics_port}: {e.strerror or e}",
                file=sys.stderr,
            )
            return 2
        LOG.info("Prometheus metrics on http://%s:%d/metrics", address, args.metrics_port)
    # SIGINT/SIGTERM: warm shutdown; a second one: cold (see shutdown.py).
    stopper = shutdown.Shutdown(worker, display_banner=True, banner_writer=_print_banner)
    stopper.install_signal_handlers()
    try:
        with worker_setup.PidFile(args.pidfile) if args.pidfile else contextlib.nullcontext():
            status = stopper.serve()
    except worker_setup.SetupError as e:
        print(f"flowengine worker: {e}", file=sys.stderr)
        return 2
    if status == shutdown.EXIT_COLD:
        # Request threads may be parked (or still in a body that cannot be
        # stopped): leave without waiting for them.
        logging.shutdown()
        os._exit(status)
    return status


class _NoTasks(Exception):
    """A ``--tasks`` item could not be imported or defines no task class."""


def _task_classes(items: Sequence[str]) -> list[type]:
    """The task classes ``--tasks`` names, each item checked on its own.

    Modules are looked up in the current directory too, as ``flowengine run``
    and ``graph`` do. A module that defines no task is an error: a worker
    serving nothing would leave every request for it waiting.
    """
    from flowengine.commands import loading
    from flowengine.engines.worker_based.worker_side import worker as wkr

    loading.make_cwd_importable()
    classes: list[type] = []
    for item in items:
        try:
            found = [endpoint.task_cls for endpoint in wkr.derive_endpoints([item])]
        except (ImportError, TypeError, AttributeError) as e:
            raise _NoTasks(f"--tasks {item}: {e}") from e
        if not found:
            raise _NoTasks(
                f"--tasks {item}: the module defines no task class (a concrete"
                f" Task subclass defined in it, not imported into it)"
            )
        classes.extend(found)
    return classes


def _read_secret_file(path: str | None) -> list[str] | None:
    """Keys in ``--secret-file`` (None: fall back to the environment)."""
    if path is None:
        return None
    from flowengine.engines.worker_based.wire import signing

    return signing.read_key_file(path)


def _print_banner(text: str) -> None:
    print(text, flush=True)


# --- demo --------------------------------------------------------------------


class _Progress:
    """A live one-line view of how many tasks finished."""

    def __init__(self, total: int, stream: Any) -> None:
        self._total = total
        self._done = 0
        self._stream = stream
        self._lock = threading.Lock()
        self._live = stream.isatty()

    def on_task(self, state: str, details: dict[str, Any]) -> None:
        """Atom notifier callback: count tasks as they succeed."""
        if state != "SUCCESS" or "task_name" not in details:
            return
        with self._lock:
            self._done += 1
            width = 30
            filled = width * self._done // self._total
            line = (
                f"[{'#' * filled}{'.' * (width - filled)}] {self._done}/{self._total}"
                f" tasks done (last: {details['task_name']})"
            )
            if self._live:
                self._stream.write("\r" + line.ljust(79))
            elif self._done * 10 // self._total != (self._done - 1) * 10 // self._total:
                # Not a terminal (a log, a pipe): one line per tenth, not per task.
                self._stream.write(line + "\n")
            self._stream.flush()

    def start(self) -> None:
        """Nothing to draw before the first task ends."""

    def finish(self) -> None:
        """End the live line."""
        if self._live:
            self._stream.write("\n")
            self._stream.flush()


def _worker_command(
    exchange: str, topic: str, url: str | None, transport: str | None, options: dict[str, Any]
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "flowengine",
        "worker",
        "--exchange",
        exchange,
        "--topic",
        topic,
        "--tasks",
        "flowengine.demo.tasks",
    ]
    if url:
        cmd += ["--url", url]
    if transport:
        cmd += ["--transport", transport]
    for key, value in options.items():
        cmd += ["--transport-option", f"{key}={json.dumps(value)}"]
    return cmd


def _child_env() -> dict[str, str]:
    """Environment for worker processes: they must import this very flowengine."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each worker, then kill those still there after the grace period."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + DEMO_WORKER_STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return ""


def run_demo(args: argparse.Namespace) -> int:
    """Start worker processes, run the demo flow on them, print the result."""
    from kombu.utils.url import maybe_sanitize_url

    from flowengine import engines
    from flowengine.demo import flow as demo_flow
    from flowengine.engines.worker_based.executor_side import executor as wbe
    from flowengine.engines.worker_based.transports import errors as broker_errors

    if args.workers < 1:
        print("flowengine demo: --workers must be at least 1", file=sys.stderr)
        return 2
    broker_errors.check_shared(args.url, None, "the demo's workers are separate processes")
    sources = args.sources or demo_flow.DEFAULT_SOURCES
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flowengine-demo-") as tmp:
        transport: str | None = None
        options: dict[str, Any] = {}
        if not args.url:
            transport = DEMO_TRANSPORT
            options = {"data_folder": tmp}
        # A fresh exchange per run: old queues on a real broker cannot interfere.
        exchange = f"{DEMO_EXCHANGE}-{uuid.uuid4().hex[:8]}"
        where = maybe_sanitize_url(args.url) if args.url else f"filesystem transport in {tmp}"
        print(f"Starting {args.workers} worker processes ({where})...", flush=True)
        procs: list[subprocess.Popen[bytes]] = []
        logs: list[str] = []
        executor = None
        try:
            # Listening before the workers start: each one's announcement
            # reaches us (a NOTIFY to their shared topic would reach only one).
            executor = wbe.WorkerTaskExecutor(
                uuid=uuid.uuid4().hex,
                exchange=exchange,
                topics=[DEMO_TOPIC],
                url=args.url,
                transport=transport,
                transport_options=options or None,
            )
            executor.start()
            cmd = _worker_command(exchange, DEMO_TOPIC, args.url, transport, options)
            for i in range(args.workers):
                log_path = os.path.join(tmp, f"worker-{i}.log")
                logs.append(log_path)
                with open(log_path, "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            cmd, stdout=log, stderr=subprocess.STDOUT, env=_child_env()
                        )
                    )
            missing = executor.wait_for_workers(args.workers, DEMO_WORKER_START_TIMEOUT_S)
            if missing:
                print(
                    f"flowengine demo: {missing} of {args.workers} workers did not"
                    f" announce themselves within {DEMO_WORKER_START_TIMEOUT_S:.0f} s",
                    file=sys.stderr,
                )
                for path in logs:
                    print(f"--- {os.path.basename(path)} ---\n{_tail(path)}", file=sys.stderr)
                return 1
            ready = time.monotonic()
            print(f"{args.workers} workers ready after {ready - started:.2f} s", flush=True)
            flow = demo_flow.make_flow(sources)
            total = demo_flow.task_count(sources)
            engine = engines.load(flow, engine="worker-based", executor=executor)
            progress: Any
            if sys.stdout.isatty():
                # The live display `flowengine run` uses (rich): bars per task.
                from flowengine.commands import progress as progress_mod

                progress = progress_mod.FlowProgress(total, description="demo")
                progress.attach(engine)
            else:
                progress = _Progress(total, sys.stdout)
                engine.atom_notifier.register("*", progress.on_task)
            progress.start()
            errors: list[BaseException] = []

            def run() -> None:
                try:
                    engine.run()
                except BaseException as e:  # reported below, after the workers stop
                    errors.append(e)

            runner = threading.Thread(target=run, name="flowengine-demo", daemon=True)
            runner.start()
            runner.join(DEMO_RUN_TIMEOUT_S)
            progress.finish()
            if runner.is_alive():
                print(
                    f"flowengine demo: the flow did not finish within {DEMO_RUN_TIMEOUT_S:.0f} s",
                    file=sys.stderr,
                )
                return 1
            if errors:
                print(f"flowengine demo: the flow failed: {errors[0]}", file=sys.stderr)
                return 1
            took = time.monotonic() - ready
            report = engine.storage.fetch("report")
            print(f"Result: {report}")
            expected = demo_flow.expected_total(sources)
            if report != f"{sources} sources, sum of squares = {expected}":
                print(
                    f"flowengine demo: unexpected result (expected total {expected})",
                    file=sys.stderr,
                )
                return 1
            print(
                f"Ran {total} tasks on {args.workers} workers in {took:.2f} s"
                f" ({1000 * took / total:.1f} ms per task); total"
                f" {time.monotonic() - started:.2f} s",
                flush=True,
            )
            return 0
        finally:
            if executor is not None:
                executor.stop()
            _stop_processes(procs)
