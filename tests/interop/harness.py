"""Running one shared flow on either library's worker-based engine, and its outcome.

The outcome is everything a user can observe of a run, in plain data so runs
on different fleets can be compared with ``==``: the error raised (type and
message of each failure), each atom's final state, the stored results, the
progress the engine-side task heard, and the marker files the tasks' execute
and revert left behind (with what each revert was given).
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.interop import shared_tasks as st

#: Seconds a request may wait for a worker before the run fails (bounds a
#: hang when discovery is broken; a healthy run needs far less).
TRANSITION_TIMEOUT_S = 30.0

#: Seconds to wait for an in-process worker to start consuming.
WORKER_START_S = 10.0

#: TaskFlow's memory transport polls; this is its poll period (s) in tests
#: (TaskFlow's default is 1 s per hop).
TASKFLOW_MEMORY_POLL_S = 0.02

#: TaskFlow's consume loop runs its periodic work (the first NOTIFY, releasing
#: waiting requests) after each drain timeout, 1 s by default; tests shorten it.
TASKFLOW_DRAIN_PERIOD_S = 0.05


def tune_taskflow() -> None:
    """Shorten TaskFlow's drain period in this process (its proxies read it at creation)."""
    from taskflow.engines.worker_based import proxy

    proxy.DRAIN_EVENTS_PERIOD = TASKFLOW_DRAIN_PERIOD_S


def _failure_summary(error: BaseException) -> list[tuple[str, str]]:
    """(kind, message) of each failure an engine run raised."""
    if type(error).__name__ == "WrappedFailure":
        out = []
        for failure in error:
            kind = "RuntimeError" if failure.check("RuntimeError") else "other"
            out.append((kind, failure.exception_str))
        return sorted(out)
    kind = "RuntimeError" if isinstance(error, RuntimeError) else type(error).__name__
    return [(kind, str(error))]


def _listen_for_progress(library: str, flow: Any, engine: Any, heard: list[float]) -> None:
    """Collect the progress reported by the remote task, as each library exposes it.

    TaskFlow's engine re-notifies the flow's own task object; flowengine's
    notifies its atom notifier (the flow's task object only hears the 0.0
    and 1.0 the engine itself sets). Either way only the remote task's own
    values are kept.
    """

    def on_progress(_event: str, details: dict[str, Any]) -> None:
        if details["progress"] not in (0.0, 1.0):
            heard.append(details["progress"])

    if library == "taskflow":
        for atom in flow:
            atom.notifier.register("update_progress", on_progress)
    else:
        engine.atom_notifier.register("update_progress", on_progress)


def _markers(folder: str) -> dict[str, str]:
    found = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            found[name] = f.read()
    return found


def run_flow(
    library: str, kind: str, tasks: Any, marker_dir: str, **options: Any
) -> dict[str, Any]:
    """Run the ``kind`` flow on ``library``'s worker-based engine; return its outcome."""
    engines = importlib.import_module(f"{library}.engines")
    flow, store = st.make_flow(kind, tasks, marker_dir)
    heard: list[float] = []
    options.setdefault("transition_timeout", TRANSITION_TIMEOUT_S)
    engine = engines.load(flow, store=store, engine="worker-based", **options)
    if kind == "progress":
        _listen_for_progress(library, flow, engine, heard)
    error = None
    try:
        engine.run()
    except Exception as e:  # the outcome records it
        error = _failure_summary(e)
    return {
        "error": error,
        "states": {name: engine.storage.get_atom_state(name) for name in st.atom_names(kind)},
        # The marker folder differs per run by design: compared by name only.
        "results": {
            k: ("<marker_dir>" if k == "marker_dir" else v)
            for k, v in engine.storage.fetch_all().items()
        },
        "progress": heard,
        "markers": _markers(marker_dir),
    }


@contextmanager
def thread_worker(
    library: str, tasks: Any, exchange: str, topic: str, **options: Any
) -> Iterator[Any]:
    """A worker of ``library`` serving ``tasks`` in a thread of this process."""
    module = importlib.import_module(f"{library}.engines.worker_based.worker")
    classes = [getattr(tasks, name) for name in st.TASK_NAMES]
    worker = module.Worker(exchange=exchange, topic=topic, tasks=classes, **options)
    thread = threading.Thread(
        target=worker.run,
        kwargs={"display_banner": False},
        name=f"interop-{library}-worker",
        daemon=True,
    )
    thread.start()
    try:
        if library == "flowengine":
            assert worker.wait(WORKER_START_S), "flowengine worker did not start"
        else:
            _wait_taskflow(worker)
        yield worker
    finally:
        worker.stop()
        thread.join(WORKER_START_S)


def _wait_taskflow(worker: Any) -> None:
    """TaskFlow's Worker.wait() has no timeout: wait in a helper thread, bounded."""
    done = threading.Event()

    def waiter() -> None:
        worker.wait()
        done.set()

    threading.Thread(target=waiter, daemon=True).start()
    assert done.wait(WORKER_START_S), "TaskFlow worker did not start"
