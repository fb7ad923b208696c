"""flowengine's kombu transports: whole, ordered, prompt delivery (no polling delay)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import queue as queue_mod
import signal
import statistics
import subprocess
import sys
import threading
import time

import kombu
import pytest
from kombu.exceptions import ChannelError

from flowengine.engines.worker_based import protocol as pr
from flowengine.engines.worker_based import transports
from flowengine.engines.worker_based.messaging import dispatcher
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.transports import filesystem as fs
from flowengine.engines.worker_based.transports import filesystem_bindings as fs_bindings
from flowengine.engines.worker_based.transports import filesystem_layout as fs_layout
from flowengine.engines.worker_based.transports import inotify
from flowengine.engines.worker_based.transports import memory as mem
from tests import waiting

WAIT_S = 10.0
#: Bound (s) on a child Python process that imports kombu and runs a few
#: steps: seconds on a loaded machine (CI runs two tests at once beside
#: busy loops), so only a hang should reach it.
PROCESS_S = 120.0


def fs_conn(folder, **options) -> kombu.Connection:
    opts = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    opts.update(options)
    return kombu.Connection(
        "filesystem://localhost",
        transport=transports.resolve(None, "filesystem"),
        transport_options=opts,
    )


def test_resolve_picks_flowengine_transports():
    assert transports.resolve(None, "memory") == "flowengine-memory"
    assert transports.resolve(None, "filesystem") == "flowengine-filesystem"
    assert transports.resolve("memory://", None) == "flowengine-memory"
    assert transports.resolve("filesystem://", None) == "flowengine-filesystem"
    assert transports.resolve("redis://h:1/0", None) == "flowengine-redis"
    assert transports.resolve(None, "redis") == "flowengine-redis"
    assert transports.resolve("amqp://h//", None) == "flowengine-amqp"
    assert transports.resolve("pyamqp://h//", None) == "flowengine-amqp"
    assert transports.resolve(None, "pyamqp") == "flowengine-amqp"
    assert transports.resolve("localhost", None) == "flowengine-amqp"  # kombu's default
    # TLS: ours too, so that the server's host name is checked (see amqp.py)
    assert transports.resolve("amqps://h//", None) == "flowengine-amqps"
    original = "kombu.transport.filesystem:Transport"
    assert transports.resolve(None, original) == original  # opt-out stays possible
    aliases = kombu.transport.TRANSPORT_ALIASES
    assert aliases["flowengine-filesystem"].endswith("filesystem:Transport")
    assert (
        kombu.Connection("memory://", transport="flowengine-memory").transport_cls
        == "flowengine-memory"
    )


# --- filesystem ---


@pytest.mark.slow  # a second or more: out of the fast tier (tests/fast_tier.py)
def test_many_fast_messages_arrive_whole_and_in_order(tmp_path):
    # Given one producer writing 1,000 messages as fast as it can (many share
    # a millisecond), some of them large,
    big = "x" * 100_000
    with fs_conn(tmp_path) as prod_conn, fs_conn(tmp_path) as cons_conn:
        consumer_q = cons_conn.SimpleQueue("ordered")
        producer_q = prod_conn.SimpleQueue("ordered")
        for i in range(1000):
            producer_q.put({"i": i, "pad": big if i % 100 == 0 else ""})
        # When one consumer reads them all,
        got = []
        for _ in range(1000):
            message = consumer_q.get(timeout=WAIT_S)
            got.append(message.payload)
            message.ack()
        consumer_q.close()
        producer_q.close()
    # Then every message arrives once, complete, in the order written.
    assert [m["i"] for m in got] == list(range(1000))
    assert all(m["pad"] == (big if m["i"] % 100 == 0 else "") for m in got)


def test_file_names_sort_in_write_order(tmp_path):
    with fs_conn(tmp_path) as conn:
        channel = conn.channel()
        for i in range(200):
            channel._put("q", {"i": i})
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".q.msg"))
    bodies = [json.loads((tmp_path / n).read_text())["i"] for n in names]
    assert bodies == list(range(200))


def test_files_are_written_aside_and_only_renames_land_in_the_folder(tmp_path):
    # Given the inotify events of the message folder watched as consumers do,
    watcher = inotify.FolderWatcher()
    if not watcher.active:
        pytest.skip("no inotify here")
    with fs_conn(tmp_path) as conn:
        channel = conn.channel()
        watcher.watch(str(tmp_path))
        landed: list[str] = []
        # when messages are written,
        for i in range(3):
            channel._put("q", {"i": i})
        watcher.landed(lambda name: landed.append(name) or False)
        # then each lands once, under its final name (the temporary file is
        # written in the unwatched .writing subfolder, which is left empty).
        assert len(landed) == 3 and all(n.endswith(".q.msg") for n in landed), landed
        assert os.listdir(tmp_path / ".writing") == []
    watcher.close()


def test_a_message_inotify_reported_is_delivered_after_one_listing(tmp_path):
    # Given a message in a queue's folder,
    with fs_conn(tmp_path) as conn:
        channel = conn.channel()
        channel._put("q", {"i": 1})
        name = next(n for n in os.listdir(tmp_path) if n.endswith(".q.msg"))
        scans = []
        scan = channel._scan
        channel._scan = lambda queue: scans.append(queue) or scan(queue)
        # when the reader was told of its arrival before it lists the folder,
        conn.transport.landed_names = {name}
        ready = channel._ready("q")
        # then one listing delivers it,
        assert list(ready) == [name] and len(scans) == 1
        # while a message nobody reported needs to be seen in two listings
        # (a listing is not a snapshot: see Channel._ready).
        conn.transport.landed_names = frozenset()
        channel._put("r", {"i": 2})
        scans.clear()
        assert len(channel._ready("r")) == 1 and scans == ["r", "r"]


def _traced_consumer(conn, queue, got, trace):
    """Consume ``queue`` on ``conn``; each listing and each inotify wait is added to ``trace``."""
    consumer = kombu.Consumer(
        conn,
        [kombu.Queue(queue, kombu.Exchange(queue), queue)],
        callbacks=[lambda body, message: got.append(body) or message.ack()],
    )
    consumer.consume()
    channel = consumer.channel
    if not hasattr(channel, "_traced"):
        scan = channel._scan
        channel._scan = lambda q: trace.append(q) or scan(q)
        channel._traced = True
    return consumer


def _trace_waits(conn, trace):
    watcher = conn.transport._watcher
    wait_for = watcher.wait_for
    watcher.wait_for = lambda *a: trace.append("wait") or wait_for(*a)


def _send(conn, queue, body):
    kombu.Producer(conn).publish(body, exchange=kombu.Exchange(queue), routing_key=queue)


needs_inotify = pytest.mark.skipif(not inotify.FolderWatcher().active, reason="no inotify here")


@needs_inotify
def test_after_a_delivery_nothing_is_listed_until_inotify_reports_a_file(tmp_path):
    # Given a consumer that just took the only message of its queue,
    with fs_conn(tmp_path) as conn, fs_conn(tmp_path) as producer:
        got, trace = [], []
        consumer = _traced_consumer(conn, "listing-q", got, trace)
        _send(producer, "listing-q", "1")
        conn.drain_events(timeout=WAIT_S)
        assert got == ["1"]
        _trace_waits(conn, trace)
        trace.clear()
        # when it drains again and nothing lands,
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.05)
        # then it sleeps first and lists only once the wait is over (a
        # listing before it could only have come back empty),
        assert trace[:2] == ["wait", "listing-q"], trace
        # and a file landing afterwards is still found at once.
        trace.clear()
        _send(producer, "listing-q", "2")
        conn.drain_events(timeout=WAIT_S)
        assert got == ["1", "2"] and trace[0] == "listing-q", trace
        consumer.cancel()


@needs_inotify
def test_a_queue_consumed_again_is_listed_at_once(tmp_path):
    # Given a consumer that listed queue r, stopped consuming it, and passed
    # over the report of a message for r meanwhile,
    with fs_conn(tmp_path) as conn, fs_conn(tmp_path) as producer:
        got, trace = [], []
        on_q = _traced_consumer(conn, "again-q", got, trace)
        on_r = _traced_consumer(conn, "again-r", got, trace)
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.05)
        assert "again-r" in trace
        on_r.cancel()
        _send(producer, "again-r", "r1")
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.05)
        assert got == []
        # (and whose last listing of r came after the last report it heeded,
        # as when a delivery ends a round),
        conn.transport._listed.add("again-r")
        # when it consumes r again,
        on_r = _traced_consumer(conn, "again-r", got, trace)
        _trace_waits(conn, trace)
        trace.clear()
        conn.drain_events(timeout=WAIT_S)
        # then r's message comes from a listing made before any wait.
        assert got == ["r1"] and trace[0] != "wait", trace
        on_q.cancel()
        on_r.cancel()


def _own_queue(conn, name, got):
    """A private queue ``name`` declared and consumed on ``conn``; bodies go to ``got``."""
    channel = conn.channel()
    channel.mark_private(name)
    queue = kombu.Queue(name, kombu.Exchange(name), name)
    consumer = kombu.Consumer(
        channel, [queue], callbacks=[lambda body, message: got.append(body) or message.ack()]
    )
    consumer.consume()
    return consumer


@needs_inotify
def test_a_private_queues_messages_land_in_its_own_folder_and_wake_nobody_else(tmp_path):
    # Given a private queue and a watcher of the message folder (as every
    # consumer of a shared queue has),
    with fs_conn(tmp_path) as owner, fs_conn(tmp_path) as producer:
        got: list[str] = []
        _own_queue(owner, "mine", got)
        watcher = inotify.FolderWatcher()
        watcher.watch(str(tmp_path))
        # when a message is published to it,
        _send(producer, "mine", "1")
        # then it lands in the queue's own folder, the message folder's
        # watcher hears nothing, and the owner gets it.
        assert [n for n in os.listdir(tmp_path / ".own" / "mine") if n.endswith(".mine.msg")]
        reported: list[str] = []
        watcher.landed(lambda name: reported.append(name) or False)
        assert reported == []
        owner.drain_events(timeout=WAIT_S)
        assert got == ["1"]
        watcher.close()
    # Closing its channel deletes the queue, its folder with it.
    assert not (tmp_path / ".own" / "mine").exists()


def test_a_message_kombus_own_transport_wrote_for_a_private_queue_is_delivered(tmp_path):
    # Given a private queue, and a message for it that kombu's own
    # filesystem transport (a TaskFlow process's) wrote in the message
    # folder, knowing nothing of the queue's folder,
    kombus = kombu.Connection(
        "filesystem://",
        transport="kombu.transport.filesystem:Transport",
        transport_options={
            "data_folder_in": str(tmp_path),
            "data_folder_out": str(tmp_path),
            "control_folder": str(tmp_path / "control"),
        },
    )
    with fs_conn(tmp_path) as owner, kombus as producer:
        got: list[str] = []
        _own_queue(owner, "mine-too", got)
        _send(producer, "mine-too", "old")
        assert [n for n in os.listdir(tmp_path) if n.endswith(".mine-too.msg")]
        # when its owner drains,
        deadline = time.monotonic() + WAIT_S
        while not got and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                owner.drain_events(timeout=0.5)
        # then it gets the message, moved into the queue's folder.
        assert got == ["old"]
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".mine-too.msg")]


def test_a_message_for_a_private_queue_deleted_meanwhile_is_dropped_not_an_error(
    tmp_path, caplog, monkeypatch
):
    # Given a private queue whose folder goes (its owner deleting it) after
    # a publisher saw it and before its message is renamed into it,
    with fs_conn(tmp_path) as owner, fs_conn(tmp_path) as producer:
        _own_queue(owner, "gone", [])
        _send(producer, "gone", "first")
        for name in os.listdir(tmp_path / ".own" / "gone"):
            os.unlink(tmp_path / ".own" / "gone" / name)
        os.rmdir(tmp_path / ".own" / "gone")
        monkeypatch.setattr(fs.os.path, "isdir", lambda path: True)  # (seen before it went)
        # when the message is renamed, then nothing is raised and the drop
        # is said.
        with caplog.at_level(logging.INFO):
            _send(producer, "gone", "late")
        assert "queue was deleted" in caplog.text
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".gone.msg")]


def test_a_message_for_a_private_queue_that_cannot_be_written_is_an_error_not_a_drop(tmp_path):
    # Given a private queue, and the folder messages are written in gone,
    with fs_conn(tmp_path) as owner, fs_conn(tmp_path) as producer:
        _own_queue(owner, "unwritable", [])
        producer.default_channel  # noqa: B018 - its channel exists (channels make the folder)
        os.rmdir(tmp_path / ".writing")
        # when a message is published to it, then the publisher hears why.
        with pytest.raises(ChannelError, match="Cannot add message file"):
            _send(producer, "unwritable", "x")


def test_a_reply_queue_is_taken_without_claim_files_and_each_message_once(tmp_path):
    # Given two readers of one private reply queue (taken without claims),
    with fs_conn(tmp_path) as conn_a, fs_conn(tmp_path) as conn_b:
        readers = [conn_a.channel(), conn_b.channel()]
        for reader in readers:
            reader.take_in_batches("replies")
        for i in range(200):
            readers[0]._put("replies", {"i": i})
        got: list[list[int]] = [[], []]
        claims_seen = False
        # when they take turns until the queue is empty,
        while True:
            taken = 0
            for reader, theirs in zip(readers, got):
                try:
                    theirs.append(reader._get("replies")["i"])
                    taken += 1
                except queue_mod.Empty:
                    pass
                claims_seen = claims_seen or any(
                    n.startswith(".claim-") for n in os.listdir(tmp_path)
                )
            if not taken:
                break
    # then every message was taken exactly once, each reader's in order, and
    # no claim file was ever made.
    assert sorted(got[0] + got[1]) == list(range(200))
    assert all(theirs == sorted(theirs) for theirs in got)
    assert not claims_seen
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".replies.msg")]


def test_readers_never_see_half_written_files(tmp_path):
    # Given a writer producing large messages and a reader scanning the folder
    # (without claiming) as fast as it can,
    stop = threading.Event()
    partial, whole = [], [0]

    def scan():
        while not stop.is_set():
            for name in os.listdir(tmp_path):
                if not name.endswith(".msg"):
                    continue
                try:
                    raw = (tmp_path / name).read_bytes()
                except FileNotFoundError:
                    continue
                try:
                    json.loads(raw)
                    whole[0] += 1
                except ValueError:
                    partial.append(name)

    reader = threading.Thread(target=scan, daemon=True)
    with fs_conn(tmp_path) as conn:
        channel = conn.channel()
        reader.start()
        for i in range(60):
            channel._put("big", {"i": i, "pad": "y" * 500_000})
        stop.set()
        reader.join(WAIT_S)
    # Then every file it could see was complete.
    assert partial == [] and whole[0] > 0


def test_two_consumers_never_get_the_same_message(tmp_path):
    total = 400
    with fs_conn(tmp_path) as prod:
        queue = prod.SimpleQueue("shared")
        for i in range(total):
            queue.put({"i": i})
        queue.close()
    seen: list[list[int]] = [[], []]

    def consume(slot):
        with fs_conn(tmp_path) as conn:
            q = conn.SimpleQueue("shared")
            while True:
                try:
                    message = q.get(timeout=0.3)
                except q.Empty:
                    break
                seen[slot].append(message.payload["i"])
                message.ack()
            q.close()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 3)
    everything = seen[0] + seen[1]
    assert sorted(everything) == list(range(total))  # none lost, none twice
    assert seen[0] == sorted(seen[0]) and seen[1] == sorted(seen[1])


def test_concurrent_bindings_on_a_fresh_folder_are_all_kept(tmp_path):
    barrier = threading.Barrier(12)

    def bind(i):
        with fs_conn(tmp_path) as conn:
            channel = conn.channel()
            barrier.wait(WAIT_S)
            channel._queue_bind("race-ex", f"key{i}", "", f"queue{i}")

    threads = [threading.Thread(target=bind, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    with fs_conn(tmp_path) as conn:
        table = conn.channel().get_table("race-ex")
    assert sorted(q.queue for q in table) == sorted(f"queue{i}" for i in range(12))


def test_binding_table_changes_are_seen_at_once(tmp_path):
    with fs_conn(tmp_path) as reader_conn, fs_conn(tmp_path) as writer_conn:
        reader, writer = reader_conn.channel(), writer_conn.channel()
        writer._queue_bind("tbl", "k1", "", "queue1")
        assert [q.queue for q in reader.get_table("tbl")] == ["queue1"]
        assert reader.get_table("tbl") == reader.get_table("tbl")  # cached
        # Remove one entry and add one of the same length within one tick:
        writer._delete("queue1", "tbl", "k1", "")
        writer._queue_bind("tbl", "k2", "", "queue2")
        assert [q.queue for q in reader.get_table("tbl")] == ["queue2"]
        assert reader.get_table("absent") == []


def test_a_recent_table_is_read_again_but_parsed_only_when_its_bytes_changed(tmp_path):
    with fs_conn(tmp_path) as reader_conn, fs_conn(tmp_path) as writer_conn:
        reader, writer = reader_conn.channel(), writer_conn.channel()
        writer._queue_bind("tbl", "k1", "", "queue1")
        first = reader.get_table("tbl")
        # Just written, so inside the racy window: read again, same bytes,
        # same (unchanged) entries.
        assert reader.get_table("tbl") is first
        writer._queue_bind("tbl", "k2", "", "queue2")
        assert sorted(q.queue for q in reader.get_table("tbl")) == ["queue1", "queue2"]


def test_a_table_read_just_after_a_change_is_not_trusted_once_it_settles(tmp_path, monkeypatch):
    with fs_conn(tmp_path) as reader_conn, fs_conn(tmp_path) as writer_conn:
        reader, writer = reader_conn.channel(), writer_conn.channel()
        writer._queue_bind("tbl", "k1", "", "queue1")
        table = reader._bindings.path("tbl")
        changed_ns = os.stat(table).st_mtime_ns
        # Read one microsecond after its change,
        monkeypatch.setattr(fs_bindings, "_wall_ns", lambda: changed_ns + 1_000)
        assert [q.queue for q in reader.get_table("tbl")] == ["queue1"]
        # then changed again within the same tick: same size, same mtime.
        writer._delete("queue1", "tbl", "k1", "")
        writer._queue_bind("tbl", "k2", "", "queue2")
        os.utime(table, ns=(changed_ns, changed_ns))
        # Long after, the stat key is the one the cached table was read under,
        # but that read was racy: the table is read again.
        monkeypatch.setattr(
            fs_bindings, "_wall_ns", lambda: changed_ns + 2 * fs_bindings.TABLE_RACY_WINDOW_NS
        )
        assert [q.queue for q in reader.get_table("tbl")] == ["queue2"]


def test_an_unreadable_binding_table_is_a_channel_error_naming_it(tmp_path):
    with fs_conn(tmp_path) as conn:
        channel = conn.channel()
        table = channel.control_folder / "broken.exchange"
        table.write_text("[not json")
        with pytest.raises(ChannelError, match="broken.exchange"):
            channel.get_table("broken")


def test_a_queue_declared_in_two_folders_by_one_process_is_bound_in_both(tmp_path):
    # Given a process that declared a queue on one folder,
    queue = kombu.Queue("twice", kombu.Exchange("twice-ex", type="direct"), "twice")
    with fs_conn(tmp_path / "a") as first:
        queue(first.default_channel).declare()
    # when it declares the same queue on another folder and publishes there,
    with fs_conn(tmp_path / "b") as second:
        queue(second.default_channel).declare()
        kombu.Producer(second).publish({"n": 1}, exchange=queue.exchange, routing_key="twice")
        # then the message is in that folder's queue (kombu recorded the
        # binding as declared for the whole process and never wrote it into
        # the second folder's table: the message went nowhere).
        message = second.SimpleQueue(queue).get(timeout=WAIT_S)
        assert message.payload == {"n": 1}
        message.ack()


def test_default_control_folder_is_shared_not_cwd(tmp_path):
    inbox, outbox = tmp_path / "in", tmp_path / "out"
    with kombu.Connection(
        "filesystem://localhost",
        transport="flowengine-filesystem",
        transport_options={"data_folder_in": str(inbox), "data_folder_out": str(outbox)},
    ) as conn:
        channel = conn.channel()
        assert channel.control_folder == tmp_path / "control"
        assert inbox.is_dir() and outbox.is_dir()  # created when missing
    with kombu.Connection(
        "filesystem://localhost",
        transport="flowengine-filesystem",
        transport_options={"data_folder": str(tmp_path / "all")},
    ) as conn:
        channel = conn.channel()
        assert (
            channel.data_folder_in == channel.data_folder_out == str(tmp_path / "all" / "messages")
        )
        assert channel.control_folder == tmp_path / "all" / "control"


def test_corrupt_file_is_dropped_not_fatal(tmp_path, caplog):
    with fs_conn(tmp_path) as conn:
        queue = conn.SimpleQueue("q")
        (tmp_path / "00000000000000000001_1_deadbeef.q.msg").write_bytes(b"{half")
        queue.put({"ok": True})
        message = queue.get(timeout=WAIT_S)
        assert message.payload == {"ok": True}
        message.ack()
        queue.close()
    assert "unreadable message file" in caplog.text


def test_polling_fallback_without_inotify(tmp_path, monkeypatch):
    monkeypatch.setattr(inotify, "_LIBC", None)
    with fs_conn(tmp_path) as prod, fs_conn(tmp_path) as cons:
        cq = cons.SimpleQueue("p")
        pq = prod.SimpleQueue("p")
        got = []
        t = threading.Thread(target=lambda: got.append(cq.get(timeout=WAIT_S)))
        t.start()
        time.sleep(0.05)  # let the consumer block first (not synchronisation)
        pq.put({"n": 1})
        t.join(WAIT_S)
        assert got and got[0].payload == {"n": 1}
        assert not cons.transport._watcher.active
        got[0].ack()
        cq.close()
        pq.close()


def test_a_consumer_wakes_only_for_messages_of_its_queues(tmp_path):
    # Given a watcher of a folder, waiting for messages of queue "mine"
    watcher = inotify.FolderWatcher()
    if not watcher.active:
        pytest.skip("no inotify on this system")
    try:
        watcher.watch(str(tmp_path))
        wanted = fs_layout.message_of({"mine"})
        # When what every process writes there lands: temporary files, claims,
        # other queues' messages
        (tmp_path / ".tmp-1").write_bytes(b"{}")
        os.rename(tmp_path / ".tmp-1", tmp_path / "00000000000000000001_a.theirs.msg")
        os.rename(
            tmp_path / "00000000000000000001_a.theirs.msg",
            tmp_path / ".claim-1@h@t@00000000000000000001_a.theirs.msg",
        )
        # Then it is not woken (the kernel queued those events as they happened)
        assert watcher.landed(wanted) is False
        # But a message of its queue wakes it, written in place or renamed into it
        (tmp_path / "00000000000000000002_b.mine.msg").write_bytes(b"{}")
        assert watcher.landed(wanted) is True
        (tmp_path / ".tmp-2").write_bytes(b"{}")
        os.rename(tmp_path / ".tmp-2", tmp_path / "00000000000000000003_c.mine.msg")
        assert watcher.landed(wanted) is True
        assert watcher.landed(wanted) is False  # each event is read once
    finally:
        watcher.close()


# --- memory ---


def test_memory_consumer_wakes_at_once_on_put():
    name = f"wake-{time.monotonic_ns()}"
    with (
        kombu.Connection("memory://localhost", transport="flowengine-memory") as prod,
        kombu.Connection("memory://localhost", transport="flowengine-memory") as cons,
    ):
        cq, pq = cons.SimpleQueue(name), prod.SimpleQueue(name)
        delays = []
        for _ in range(20):
            got = threading.Event()
            stamp = []

            def wait_one():
                message = cq.get(timeout=WAIT_S)
                stamp.append(time.perf_counter())
                message.ack()
                got.set()

            t = threading.Thread(target=wait_one)
            t.start()
            time.sleep(0.002)  # let it block in drain_events (not synchronisation)
            sent = time.perf_counter()
            pq.put({"x": 1})
            assert got.wait(WAIT_S)
            t.join(WAIT_S)
            delays.append(stamp[0] - sent)
        cq.close()
        pq.close()
    # kombu's own memory transport sleeps 1 s between empty polls.
    assert statistics.median(delays) < 0.02, delays


def test_memory_put_wakes_only_the_consumers_of_its_queue():
    first, second = (f"wake-{i}-{time.monotonic_ns()}" for i in range(2))
    with (
        kombu.Connection("memory://localhost", transport="flowengine-memory") as a,
        kombu.Connection("memory://localhost", transport="flowengine-memory") as b,
        kombu.Connection("memory://localhost", transport="flowengine-memory") as p,
    ):
        # Given two consumers, each of its own queue, both having looked once
        qa, qb = a.SimpleQueue(first), b.SimpleQueue(second)
        for q in (qa, qb):
            with pytest.raises(q.Empty):
                q.get(timeout=0.001)
        before = a.transport._waiter.generation, b.transport._waiter.generation
        # When a message is put to the first queue
        p.SimpleQueue(first).put({"for": "a"})
        # Then only the first consumer was woken, and it gets the message
        after = a.transport._waiter.generation, b.transport._waiter.generation
        assert (after[0] - before[0], after[1] - before[1]) == (1, 0)
        message = qa.get(timeout=WAIT_S)
        assert message.payload == {"for": "a"}
        message.ack()


#: tests.waiting.wait_until, looking often: a thread of this process gets
#: there within microseconds.
_wait_until = functools.partial(waiting.wait_until, timeout=WAIT_S, poll_s=0.001)


def _drain_one(conn, got):
    try:
        conn.drain_events(timeout=WAIT_S)
    except TimeoutError:
        return
    got.append(conn)


def test_memory_put_wakes_one_of_several_idle_consumers_of_its_queue():
    name = f"one-{time.monotonic_ns()}"
    # (No idle re-check while the test runs: a consumer awake for one at the
    # put would not be asleep, and would rightly be woken too.)
    conns = [
        kombu.Connection(
            "memory://localhost",
            transport="flowengine-memory",
            transport_options={"polling_interval": WAIT_S},
        )
        for _ in range(3)
    ]
    got: list = []
    try:
        producer, consumers = conns[0], conns[1:]
        for conn in consumers:
            conn.Consumer(
                kombu.Queue(name), callbacks=[lambda body, message: message.ack()], accept=["json"]
            ).consume()
        # Given two consumers of one queue, both asleep in drain_events
        threads = [threading.Thread(target=_drain_one, args=(conn, got)) for conn in consumers]
        for t in threads:
            t.start()
        waiters = [conn.transport._waiter for conn in consumers]
        _wait_until(lambda: all(w._cond._waiters for w in waiters), "consumers never slept")
        before = [w.generation for w in waiters]
        # When one message is put to the queue
        producer.SimpleQueue(name).put({"n": 1})
        # Then exactly one of them was woken, and it got the message
        _wait_until(lambda: got, "nobody got the message")
        bumped = [w.generation - b for w, b in zip(waiters, before)]
        assert sorted(bumped) == [0, 1]
        assert got == [consumers[bumped.index(1)]]
        # And a second message, put while the other still sleeps, wakes that one
        producer.SimpleQueue(name).put({"n": 2})
        for t in threads:
            t.join(WAIT_S)
        assert sorted(map(id, got)) == sorted(map(id, consumers))
    finally:
        for conn in conns:
            conn.close()


def test_memory_put_wakes_every_consumer_when_none_sleeps_ready():
    name = f"all-{time.monotonic_ns()}"
    options = {"polling_interval": WAIT_S}  # no idle re-check meanwhile
    with (
        kombu.Connection(
            "memory://localhost", transport="flowengine-memory", transport_options=options
        ) as full,
        kombu.Connection(
            "memory://localhost", transport="flowengine-memory", transport_options=options
        ) as busy,
        kombu.Connection("memory://localhost", transport="flowengine-memory") as producer,
    ):
        # Given a consumer at its prefetch limit (one message delivered, not
        # acknowledged) asleep in drain_events,
        held = []
        full.Consumer(
            kombu.Queue(name),
            callbacks=[lambda b, m: held.append(m)],
            accept=["json"],
            prefetch_count=1,
        ).consume()
        producer.SimpleQueue(name).put({"n": 0})
        full.drain_events(timeout=WAIT_S)
        assert len(held) == 1 and not full.default_channel.qos.can_consume()
        got: list = []
        sleeper = threading.Thread(target=_drain_one, args=(full, got))
        sleeper.start()
        _wait_until(lambda: full.transport._waiter._cond._waiters, "it never slept")
        # and another that looked once and went on with other work (not asleep)
        busy.Consumer(
            kombu.Queue(name), callbacks=[lambda b, m: m.ack()], accept=["json"]
        ).consume()
        with pytest.raises(TimeoutError):
            busy.drain_events(timeout=0.001)
        waiters = full.transport._waiter, busy.transport._waiter
        before = [w.generation for w in waiters]
        # When a message is put to the queue
        producer.SimpleQueue(name).put({"n": 1})
        # Then neither was picked alone: both are bumped (the busy one looks
        # again before it sleeps, and takes the message)
        assert [w.generation - b for w, b in zip(waiters, before)] == [1, 1]
        busy.drain_events(timeout=WAIT_S)
        # And once it has room again, the full one takes the next message
        held[0].ack()
        producer.SimpleQueue(name).put({"n": 2})
        sleeper.join(WAIT_S)
        assert got == [full] and len(held) == 2


def test_memory_interoperates_with_kombus_memory_transport():
    name = f"interop-{time.monotonic_ns()}"
    with (
        kombu.Connection(
            "memory://localhost", transport="kombu.transport.memory:Transport"
        ) as plain,
        kombu.Connection("memory://localhost", transport="flowengine-memory") as ours,
    ):
        cq, pq = ours.SimpleQueue(name), plain.SimpleQueue(name)
        pq.put({"from": "kombu"})
        message = cq.get(timeout=WAIT_S)
        assert message.payload == {"from": "kombu"}
        message.ack()
        cq.close()
        pq.close()
    assert mem.IDLE_RECHECK_S <= 0.1


# --- request/reply round trip through two proxies ---


def _round_trips(transport, options, count=200):
    exchange = f"rt{time.monotonic_ns()}"
    replied = threading.Event()

    def on_request(data, message):
        server.publish(
            pr.Response(pr.SUCCESS, result=data["n"]),
            message.properties["reply_to"],
            correlation_id=message.properties["correlation_id"],
        )

    server = px.Proxy(
        "server",
        exchange,
        {pr.REQUEST: dispatcher.Handler(on_request)},
        broker=BrokerSettings(transport=transport, transport_options=options),
    )
    client = px.Proxy(
        "client",
        exchange,
        {pr.RESPONSE: dispatcher.Handler(lambda d, m: replied.set())},
        broker=BrokerSettings(transport=transport, transport_options=options),
    )
    threads = [threading.Thread(target=p.start, daemon=True) for p in (server, client)]
    for t in threads:
        t.start()
    assert server.wait(WAIT_S) and client.wait(WAIT_S)

    class Ping(pr.Message):
        TYPE = pr.REQUEST

        def __init__(self, n):
            self.n = n

        def to_dict(self):
            return {"n": self.n}

    times = []
    try:
        for n in range(count):
            replied.clear()
            start = time.perf_counter()
            client.publish(Ping(n), "server", reply_to="client", correlation_id=str(n))
            assert replied.wait(WAIT_S)
            times.append(time.perf_counter() - start)
    finally:
        server.stop()
        client.stop()
        for t in threads:
            t.join(WAIT_S)
    return times


@pytest.mark.parametrize("transport", ["memory", "filesystem"])
def test_in_process_round_trip_is_fast(transport, tmp_path, capsys):
    options = {"data_folder": str(tmp_path)} if transport == "filesystem" else None
    times = _round_trips(transport, options)
    median = statistics.median(times) * 1000
    p90 = sorted(times)[int(len(times) * 0.9)] * 1000
    with capsys.disabled():
        print(f"\n[round trip] {transport}: median {median:.3f} ms, p90 {p90:.3f} ms")
    # Polling transports cost ~1 s per hop; ours answer within milliseconds.
    assert median < (5 if transport == "memory" else 25), times


@pytest.mark.slow  # thousands of files on a shared disk: a few seconds
def test_concurrent_producer_and_consumer_keep_order(tmp_path):
    # Given a folder crowded with other queues' files (so listing it is not
    # one atomic read) and a consumer reading while a producer writes,
    total = 1500
    with fs_conn(tmp_path) as conn:
        channel = conn.channel()
        for i in range(1000):
            channel._put("crowd", {"i": i})
    got = []

    def consume():
        with fs_conn(tmp_path) as conn:
            q = conn.SimpleQueue("live")
            for _ in range(total):
                message = q.get(timeout=WAIT_S)
                got.append(message.payload["i"])
                message.ack()
            q.close()

    consumer = threading.Thread(target=consume)
    with fs_conn(tmp_path) as prod:
        q = prod.SimpleQueue("live")
        consumer.start()
        for i in range(total):
            q.put({"i": i})
        consumer.join(WAIT_S * 3)
        q.close()
    # Then it still sees them in the order written.
    assert got == list(range(total))


_CONSUME_AND_HANG = """
import sys, kombu
from flowengine.engines.worker_based import transports
folder = sys.argv[1]
conn = kombu.Connection("filesystem://localhost",
                        transport=transports.resolve(None, "filesystem"),
                        transport_options={"data_folder_in": folder, "data_folder_out": folder})
message = conn.SimpleQueue("claims").get(timeout=10)
print(message.payload["n"], flush=True)
sys.stdin.read()  # never acknowledges; the test kills us here
"""


def claims_in(folder) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith(".claim-")]


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_message_of_a_consumer_killed_before_ack_is_delivered_again(tmp_path):
    # Given a message taken by a consumer process that never acknowledges it,
    with fs_conn(tmp_path) as conn:
        conn.SimpleQueue("claims").put({"n": 7})
        child = subprocess.Popen(
            [sys.executable, "-c", _CONSUME_AND_HANG, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout.readline().strip() == "7"
            assert len(claims_in(tmp_path / ".claims")) == 1
            queue = conn.SimpleQueue("claims")
            # (while the consumer lives, nobody else can have it)
            with pytest.raises(queue.Empty):
                queue.get(timeout=fs.RECLAIM_PERIOD_S * 3)
            # When that consumer is killed (no chance to put it back itself),
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=WAIT_S)
            # then another consumer gets the message, whole, and once.
            message = queue.get(timeout=WAIT_S)
            assert message.payload == {"n": 7}
            message.ack()
            with pytest.raises(queue.Empty):
                queue.get(timeout=fs.RECLAIM_PERIOD_S * 3)
        finally:
            child.kill()
            child.wait(timeout=WAIT_S)
    assert not claims_in(tmp_path / ".claims") and not claims_in(tmp_path)


def test_acknowledged_message_leaves_no_claim_behind(tmp_path):
    with fs_conn(tmp_path) as conn:
        queue = conn.SimpleQueue("acked")
        queue.put({"n": 1})
        message = queue.get(timeout=WAIT_S)
        assert claims_in(tmp_path / ".claims")
        message.ack()
    assert not claims_in(tmp_path / ".claims")


def test_a_claim_lands_in_the_unwatched_claims_folder_and_wakes_nobody(tmp_path):
    watcher = inotify.FolderWatcher()
    if not watcher.active:
        pytest.skip("no inotify here")
    with fs_conn(tmp_path) as conn:
        queue = conn.SimpleQueue("woken")
        queue.put({"n": 1})
        watcher.watch(str(tmp_path))
        # When a consumer claims the message,
        message = queue.get(timeout=WAIT_S)
        # then the claim is a file of .claims, and the watched folder
        # reported nothing (before, every claim woke every consumer).
        assert len(claims_in(tmp_path / ".claims")) == 1 and not claims_in(tmp_path)
        reported: list[str] = []
        watcher.landed(lambda name: reported.append(name) or False)
        assert reported == []
        message.ack()
        queue.close()
    watcher.close()


_PUT_FORK_PUT = """
import os, sys, kombu
from flowengine.engines.worker_based import transports
folder = sys.argv[1]

def put(n):
    with kombu.Connection("filesystem://localhost",
                          transport=transports.resolve(None, "filesystem"),
                          transport_options={"data_folder_in": folder,
                                             "data_folder_out": folder}) as conn:
        conn.SimpleQueue("forked").put({"n": n})

put(0)
pid = os.fork()
if pid == 0:
    put(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
put(2)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_a_forked_child_names_its_files_apart_from_its_parent(tmp_path):
    # Given a process that writes a message, forks a child that writes one,
    # then writes one more (in a process of its own: forking this
    # many-threaded test process could copy a lock some thread holds),
    done = subprocess.run(
        [sys.executable, "-c", _PUT_FORK_PUT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )
    assert done.returncode == 0, done.stderr
    # then each file had a name part of its own: the part after the stamp is
    # also its temporary file's name, which parent and child would have
    # written at once with the same counter (O_EXCL: "Cannot add message file").
    parts = [
        name.partition("_")[2].partition(".")[0]
        for name in os.listdir(tmp_path)
        if name.endswith(".forked.msg")
    ]
    assert len(parts) == 3 and len(set(parts)) == 3
