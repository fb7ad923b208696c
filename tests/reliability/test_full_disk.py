"""The filesystem transport on a full disk: a clear error, and nothing lost once space returns.

Given a worker process and the engine sharing a broker folder on a small
tmpfs (2 MB), when the disk is filled and a flow is started, then the
engine says clearly what is wrong (no space left in the broker folder) and
keeps trying; when space returns, the flow completes. Then the disk fills
up again while a second flow's tasks run: the worker says so, its replies
wait, and once space returns that flow completes too. The checker counts
every task done once: 0 lost, 0 duplicated, 0 concurrent.

Needs root to mount the tmpfs: skipped (with the reason) where mounting is
not permitted, failed under CI=true.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest

from flowengine import engines
from flowengine.engines.worker_based.executor_side import executor as wex
from flowengine.patterns import unordered_flow as uf
from tests.conftest import IN_CI
from tests.reliability import checker, fault_tasks
from tests.reliability.harness import Conn, Workers
from tests.reliability.proxied import FlowRun
from tests.waiting import holds_within

pytestmark = pytest.mark.slow

#: Size of the broker's disk: small, so filling it is quick.
DISK = "2m"

#: Tasks of each flow. The second one's first task blocks until the test
#: releases it: the worker holds its request (and heartbeats for it) while the
#: disk fills up, however long filling takes on a loaded machine.
TASKS = 5

#: Bounded waits (s), only so that a bug fails the test instead of hanging it.
WAIT_S = 60.0

#: Bytes written at a time while filling the disk.
FILL_CHUNK = 64 * 1024


@contextlib.contextmanager
def _small_disk(path: str) -> Iterator[str]:
    os.makedirs(path)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", path],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        reason = f"cannot mount a tmpfs for the full-disk test: {done.stderr.strip()}"
        if IN_CI:
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)


class _Filler:
    """A file taking a disk's free space, down to its last byte, until released.

    Filling once is not enough: the engine keeps deleting the message files
    it consumes (heartbeats written just before the disk filled, say), and
    each page freed that way fits the next small message. ``top_up()`` takes
    such pages back, so that the next write by anyone else fails.
    """

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "filler")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.top_up()

    def top_up(self) -> None:
        for size in (FILL_CHUNK, 1):  # big writes, then what a partly used block holds
            while True:
                try:
                    os.write(self._fd, b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break

    def release(self) -> None:
        os.close(self._fd)
        os.unlink(self.path)


def _full_while_waiting(filler: _Filler, condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` holds within WAIT_S s, the disk kept full meanwhile."""

    def topped_up_then_checked() -> bool:
        filler.top_up()
        return condition()

    return holds_within(topped_up_then_checked, WAIT_S)


def test_full_disk_clear_error_then_nothing_lost(tmp_path, caplog, unique_name):
    with _small_disk(str(tmp_path / "disk")) as disk:
        folder = os.path.join(disk, "broker")
        os.makedirs(folder)
        conn = Conn("filesystem", transport="filesystem", transport_options={"data_folder": folder})
        records = str(tmp_path / "records.jsonl")
        logs = tmp_path / "logs"
        logs.mkdir()
        workers = Workers(conn, unique_name, "disk", records, str(logs))
        executor = wex.WorkerTaskExecutor(
            uuid.uuid4().hex, unique_name, ["disk"], transition_timeout=WAIT_S, **conn.kwargs()
        )
        names = [f"d{i}" for i in range(TASKS)]
        second = [f"e{i}" for i in range(TASKS)]
        caplog.set_level(logging.WARNING)
        try:
            workers.start()
            executor.start()
            assert executor.wait_for_workers(1, WAIT_S) == 0, workers.logs()
            # Given a full disk
            filler = _Filler(disk)
            flow = uf.Flow("disk").add(
                *[
                    fault_tasks.Step(name, inject={"n": i, "pause": 0})
                    for i, name in enumerate(names)
                ]
            )
            # When a flow starts
            run = FlowRun(engines.load(flow, engine="worker-based", executor=executor)).start()
            # Then the engine says what is wrong, clearly
            assert _full_while_waiting(filler, lambda: "no space left" in caplog.text.lower()), (
                caplog.text[-3000:]
            )
            assert not run.done.is_set()
            # When space returns, the flow completes
            filler.release()
            run.wait(WAIT_S, logs=workers.logs)
            # Given a second flow, one of whose tasks runs on the worker until released
            fifo = str(tmp_path / "release")
            os.mkfifo(fifo)
            flow = uf.Flow("disk2").add(
                fault_tasks.Blocker(second[0], inject={"fifo": fifo}),
                *[
                    fault_tasks.Step(name, inject={"n": i, "pause": 0})
                    for i, name in enumerate(second[1:], 1)
                ],
            )
            run = FlowRun(engines.load(flow, engine="worker-based", executor=executor)).start()
            assert holds_within(
                lambda: second[0] in checker.executions_by_name(checker.read_records(records)),
                WAIT_S,
            ), workers.logs()
            # When the disk fills up under it, then the worker says so (the
            # heartbeats of the request it holds wait), and once space returns
            # the flow completes
            filler = _Filler(disk)
            assert _full_while_waiting(filler, lambda: "no space left" in workers.logs().lower()), (
                workers.logs()
            )
            filler.release()
            with open(fifo, "w") as release:  # opens once the blocked task reads
                release.write("go\n")
            run.wait(WAIT_S, logs=workers.logs)
        finally:
            executor.stop()
            workers.stop_all()
    report = checker.check(checker.read_records(records), names + second)
    assert len(report.done_once) == TASKS * 2, report.summary()
    assert not report.concurrent, report.summary()
    messages = [r.getMessage() for r in caplog.records if "space" in r.getMessage().lower()]
    print(f"[full disk] {report.summary()}; first error: {messages[:1]}")
