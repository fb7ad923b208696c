"""Private queues of the filesystem transport go away with the process that owns them."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import kombu
import pytest

from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.transports import filesystem as fs
from flowengine.engines.worker_based.transports import filesystem_housekeeping as housekeeping
from flowengine.engines.worker_based.transports import filesystem_private as fp

# Out of the fast tier (tests/fast_tier.py): runs consumer processes.
pytestmark = pytest.mark.broker

#: Bound (s) on every wait: reached only when the behaviour is broken.
WAIT_S = 10.0

HERE = Path(__file__).resolve().parent.parent  # tests/worker_based
ROOT = HERE.parent.parent
CHILD = HERE / "fs_private_consumer.py"


@pytest.fixture
def names() -> dict[str, str]:
    """Fresh exchange / queue / routing key names for one test."""
    tag = uuid.uuid4().hex[:8]
    return {
        "exchange": f"fsp-{tag}",
        "queue": f"fsp-{tag}_t.host:1:{tag}",
        "key": f"t.{tag}",
        "broadcast": "t.broadcast",
    }


class Child:
    """A consumer process holding a private queue (see fs_private_consumer.py)."""

    def __init__(self, folder: Path, names: dict[str, str]) -> None:
        config = {
            "data_folder": str(folder),
            "exchange": names["exchange"],
            "queue": names["queue"],
            "routing_keys": [names["key"], names["broadcast"]],
        }
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
            ),
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def close(self) -> str:
        """Ask for a clean close; returns the child's stderr."""
        _out, err = self.proc.communicate("close\n", timeout=WAIT_S)
        assert self.proc.returncode == 0, err
        return err

    def kill(self) -> None:
        """SIGKILL: no chance to clean anything up."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=WAIT_S)


@pytest.fixture
def spawn(tmp_path: Path, names: dict[str, str]) -> Iterator[Callable[[], Child]]:
    children: list[Child] = []

    def start() -> Child:
        children.append(Child(tmp_path, names))
        return children[-1]

    yield start
    for child in children:
        child.stop()


def connect(folder: Path) -> kombu.Connection:
    return kombu.Connection(
        "filesystem://localhost",
        transport=transports.FILESYSTEM,
        transport_options={"data_folder": str(folder)},
    )


def bindings(folder: Path, names: dict[str, str]) -> list[list[str]]:
    table = folder / "control" / f"{names['exchange']}.exchange"
    return [entry for entry in json.loads(table.read_text() or "[]") if entry[2] == names["queue"]]


def markers(folder: Path, names: dict[str, str]) -> list[fp.Marker]:
    return [m for m in fp.markers(folder / "control") if m.queue == names["queue"]]


def message_files(folder: Path, names: dict[str, str]) -> list[str]:
    """The queue's message files, claimed ones and those in its own folder included."""
    suffix = f".{names['queue']}.msg"
    messages = folder / "messages"
    places = [messages, messages / ".claims", messages / ".own" / names["queue"]]
    return [
        n for where in places if where.is_dir() for n in os.listdir(where) if n.endswith(suffix)
    ]


def publish(conn: kombu.Connection, names: dict[str, str], routing_key: str, body: object) -> None:
    exchange = kombu.Exchange(names["exchange"], type="direct")
    kombu.Producer(conn.channel(), exchange=exchange).publish(
        body, routing_key=routing_key, serializer="json"
    )


def consume_until(conn: kombu.Connection, condition: Callable[[], bool]) -> bool:
    """Be a live consumer (of another queue) until ``condition`` holds; False at the bound."""
    queue = conn.SimpleQueue(f"other-{uuid.uuid4().hex[:8]}")
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        with pytest.raises(queue.Empty):
            queue.get(timeout=0.05)
    return True


def test_private_queue_of_a_killed_consumer_is_deleted_with_its_bindings(
    tmp_path, names, spawn, caplog
):
    # Given a consumer process with a private queue, holding one of its
    # messages unacknowledged,
    child = spawn()
    assert len(bindings(tmp_path, names)) == 2 and len(markers(tmp_path, names)) == 1
    with connect(tmp_path) as conn:
        publish(conn, names, names["key"], {"n": 1})
        assert json.loads(child.proc.stdout.readline()) == {"n": 1}
        # when it is killed with SIGKILL and two broadcasts still reach its queue,
        child.kill()
        publish(conn, names, names["broadcast"], {"n": 2})
        publish(conn, names, names["broadcast"], {"n": 3})
        assert len(message_files(tmp_path, names)) == 3
        # then a live consumer deletes the queue: bindings, marker and messages,
        with caplog.at_level(logging.WARNING, logger=housekeeping.LOG.name):
            assert consume_until(
                conn, lambda: not bindings(tmp_path, names) and not markers(tmp_path, names)
            )
    assert message_files(tmp_path, names) == []
    # and says how many messages went with it.
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith(f"Deleted private queue {names['queue']!r}")
    ]
    assert len(warnings) == 1 and "dropped 3 message(s)" in warnings[0], warnings


def test_private_queue_of_a_live_consumer_is_kept(tmp_path, names, spawn, monkeypatch):
    # Given a live consumer process with a private queue,
    spawn()
    passes = []
    reap = housekeeping.reap_private

    def counted(control, messages):
        reap(control, messages)
        passes.append(1)

    monkeypatch.setattr(housekeeping, "reap_private", counted)
    monkeypatch.setattr(fs, "RECLAIM_PERIOD_S", 0.0)  # a pass on every look
    # when another consumer makes several passes over the private queues,
    with connect(tmp_path) as conn:
        assert consume_until(conn, lambda: len(passes) >= 5)
    # then the live process's queue, bindings and marker are all still there.
    assert len(bindings(tmp_path, names)) == 2
    assert len(markers(tmp_path, names)) == 1


def test_cleanly_closed_private_queue_is_deleted(tmp_path, names, spawn):
    # Given a consumer process with a private queue, holding one message,
    child = spawn()
    with connect(tmp_path) as conn:
        publish(conn, names, names["key"], {"n": 1})
    assert json.loads(child.proc.stdout.readline()) == {"n": 1}
    # when it closes its connection cleanly (nobody else consumes),
    err = child.close()
    # then its queue is gone with it, message included, and it said so.
    assert bindings(tmp_path, names) == []
    assert markers(tmp_path, names) == []
    assert message_files(tmp_path, names) == []
    assert f"private queue {names['queue']!r}" in err and "dropped 1 message(s)" in err, err


def test_queue_declared_again_by_a_live_process_is_kept(tmp_path, names, spawn):
    # Given a private queue whose process was killed,
    spawn().kill()
    exchange = kombu.Exchange(names["exchange"], type="direct")
    queue = kombu.Queue(names["queue"], exchange=exchange, routing_key=names["key"])
    with connect(tmp_path) as owner, connect(tmp_path) as other:
        # when a live process declares a private queue of the same name first
        # (a worker started again with the same worker id),
        channel = owner.channel()
        channel.mark_private(names["queue"])
        queue(channel).declare()
        # then the dead process's marker goes but the binding stays,
        assert consume_until(other, lambda: len(markers(tmp_path, names)) == 1)
        assert markers(tmp_path, names)[0].pid == os.getpid()
        assert names["key"] in [b[0] for b in bindings(tmp_path, names)]
    # and goes once that live process closes.
    assert bindings(tmp_path, names) == []
    assert markers(tmp_path, names) == []
