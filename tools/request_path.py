#!/usr/bin/env python3
"""How much of flowengine one remote task crosses: files, functions and their lines.

Starts a worker (2 threads) in this process on the memory transport and an
engine's WorkerTaskExecutor that has found it, sends one request to warm up,
then sends another while a profile hook records every flowengine function
called, on every thread (the caller's, the executor's reply consumer, the
worker's consume loop and pool, helpers), from ``execute_task`` until its
result is in hand. Prints, for the whole of flowengine, for
``engines/worker_based`` and for each of its subpackages: the files those
functions live in (and those files' lines), the functions, and the lines
holding their instructions.

``--flow`` measures a whole warm ``engines.run()`` of a one-task flow
instead (compiling, storage, starting and stopping the executor included).
Use it to compare two trees::

    PYTHONPATH=/path/to/tree python tools/request_path.py
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import uuid
from types import CodeType, FrameType
from typing import Any

import flowengine
from flowengine import engines, task
from flowengine.engines.worker_based import worker as worker_mod
from flowengine.engines.worker_based.executor import WorkerTaskExecutor
from flowengine.patterns import linear_flow

PACKAGE_DIR = os.path.dirname(os.path.abspath(flowengine.__file__))
WORKER_BASED = os.path.join(PACKAGE_DIR, "engines", "worker_based")

#: Bound (s) on waits, so that a hang fails instead of blocking.
WAIT_S = 30.0


class Echo(task.Task):
    """The one task: returns what it is given."""

    def execute(self, value: int) -> int:
        return value


class CallRecorder:
    """Records each flowengine code object called while ``recording`` is set."""

    def __init__(self) -> None:
        self.recording = False
        self.codes: set[CodeType] = set()
        self._lock = threading.Lock()

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.recording or event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(PACKAGE_DIR):
            with self._lock:
                self.codes.add(code)


def body_lines(code: CodeType) -> set[int]:
    """The source lines of ``code`` that hold instructions."""
    return {line for _, _, line in code.co_lines() if line is not None}


def file_lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def summarize(codes: set[CodeType], under: str) -> tuple[int, int, int, int]:
    """(files, their lines, functions, function lines) of ``codes`` below ``under``."""
    chosen = [c for c in codes if c.co_filename.startswith(under)]
    files = {c.co_filename for c in chosen}
    lines: dict[str, set[int]] = collections.defaultdict(set)
    for code in chosen:
        lines[code.co_filename] |= body_lines(code)
    return (
        len(files),
        sum(file_lines(f) for f in files),
        len(chosen),
        sum(len(v) for v in lines.values()),
    )


def run_flow(exchange: str, topic: str) -> None:
    flow = linear_flow.Flow("one").add(Echo("echo"))
    result = engines.run(
        flow,
        engine="worker-based",
        exchange=exchange,
        topics=[topic],
        transport="memory",
        store={"value": 7},
    )
    assert result["value"] == 7, result


def measure_request(recorder: CallRecorder, exchange: str, topic: str) -> None:
    executor = WorkerTaskExecutor(uuid.uuid4().hex, exchange, [topic], transport="memory")
    executor.start()
    try:
        if executor.wait_for_workers(1, WAIT_S):  # how many are still missing
            raise RuntimeError("the executor did not find the worker")
        for attempt in range(2):
            recorder.recording = attempt == 1
            future = executor.execute_task(Echo("echo"), uuid.uuid4().hex, {"value": 7})
            _, result = future.result(WAIT_S)
            recorder.recording = False
            assert result == 7, result
    finally:
        executor.stop()


def main() -> int:
    recorder = CallRecorder()
    threading.setprofile(recorder.hook)
    sys.setprofile(recorder.hook)
    exchange, topic = f"path-{uuid.uuid4().hex[:8]}", "path"
    worker = worker_mod.Worker(exchange, topic, [Echo], threads_count=2, transport="memory")
    thread = threading.Thread(
        target=worker.run, kwargs={"display_banner": False}, name="request-path-worker", daemon=True
    )
    thread.start()
    if not worker.wait(WAIT_S):
        print("the worker did not start", file=sys.stderr)
        return 1
    try:
        if "--flow" in sys.argv[1:]:
            run_flow(exchange, topic)
            recorder.recording = True
            run_flow(exchange, topic)
            recorder.recording = False
        else:
            measure_request(recorder, exchange, topic)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        worker.stop()
        thread.join(WAIT_S)
    print(f"flowengine at {PACKAGE_DIR}")
    print(f"{'part':<34} {'files':>6} {'file lines':>11} {'functions':>10} {'body lines':>11}")
    parts = [("all of flowengine", PACKAGE_DIR), ("engines/worker_based", WORKER_BASED)]
    subpackages = sorted(
        {
            os.path.relpath(c.co_filename, WORKER_BASED).split(os.sep)[0]
            for c in recorder.codes
            if c.co_filename.startswith(WORKER_BASED)
        }
    )
    parts += [(f"  worker_based/{name}", os.path.join(WORKER_BASED, name)) for name in subpackages]
    for label, under in parts:
        files, lines, functions, body = summarize(recorder.codes, under)
        print(f"{label:<34} {files:>6} {lines:>11} {functions:>10} {body:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
