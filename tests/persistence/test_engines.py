"""Engines saving to every backend: progress, resumption, unstorable results, sharing."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest

from flowengine import engines, states, task
from flowengine import exceptions as exc
from flowengine.patterns import linear_flow as lf
from flowengine.persistence import helpers as p_utils
from flowengine.persistence import models
from tests.persistence import flows
from tests.persistence.procs import Child
from tests.persistence.stores import Store, store_url

#: Bound on the barrier the two concurrent engines meet at (fails, never hangs).
BARRIER_TIMEOUT_S = 20.0


def _load_fd(store, fd_uuid):
    with contextlib.closing(store.open().get_connection()) as conn:
        return conn.get_flow_details(fd_uuid)


def _results(fd):
    return {ad.name: ad.results for ad in fd if not ad.name.startswith("_")}


def test_engine_saves_every_atom_and_the_flow_state(store, tmp_path):
    # Given a flow loaded with a backend and a logbook
    effects = os.path.join(tmp_path, "effects")
    book = models.LogBook("book")
    engine = engines.load(flows.make_flow(effects), backend=store.backend, book=book)
    # When it runs
    engine.run()
    # Then a fresh read of the backend shows the finished flow and its results
    fd = _load_fd(store, engine.storage.flow_uuid)
    assert fd.state == states.SUCCESS
    assert _results(fd) == {"a": 1, "b": 11, "c": 111}
    assert {ad.state for ad in fd} == {states.SUCCESS}
    with contextlib.closing(store.open().get_connection()) as conn:
        assert [f.uuid for f in conn.get_logbook(book.uuid)] == [fd.uuid]


def test_suspended_flow_resumes_from_detail_in_a_new_engine(store, tmp_path):
    effects = os.path.join(tmp_path, "effects")
    book = models.LogBook("book")
    # Given a flow made by a factory, suspended once 'a' finished
    engine = engines.load_from_factory(
        flows.make_flow, factory_args=[effects], backend=store.backend, book=book
    )

    def suspend_after_a(state, details):
        if details.get("task_name") == "a":
            engine.suspend()

    engine.atom_notifier.register(states.SUCCESS, suspend_after_a)
    engine.run()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    # When a new engine is built from the detail read back from the backend
    fd = _load_fd(store, engine.storage.flow_uuid)
    flow = engines.flow_from_detail(fd)
    assert [a.name for a, _ in flow.iter_nodes()] == ["a", "b", "c"]
    resumed = engines.load_from_detail(fd, backend=store.open())
    resumed.run()
    # Then only the remaining tasks ran and the flow finished
    assert flows.executions(effects) == {"a": 1, "b": 1, "c": 1}
    assert resumed.storage.fetch("z") == 111
    assert _load_fd(store, fd.uuid).state == states.SUCCESS


def test_persistence_utils_create_and_save(store):
    book, fd = p_utils.temporary_flow_detail(store.backend, meta={"k": 1})
    made = p_utils.create_flow_detail(lf.Flow("named"), book=book, backend=store.backend)
    with contextlib.closing(store.open().get_connection()) as conn:
        stored = conn.get_logbook(book.uuid)
    assert stored.name == "tmp"
    assert {f.name for f in stored} == {"tmp-flow-detail", "named"}
    assert stored.find(fd.uuid).meta == {"k": 1}
    assert stored.find(made.uuid) is not None


class _ReturnsLock(task.Task):
    def execute(self):
        return threading.Lock()


class _Undo(task.Task):
    def execute(self):
        return "done"

    def revert(self, *args, **kwargs):
        self.reverted = True


def test_unstorable_result_is_the_atom_failure(durable_store):
    # Given a flow whose second task returns something JSON cannot hold
    flow = lf.Flow("unstorable").add(_Undo("first"), _ReturnsLock("locky"))
    book = models.LogBook("book")
    engine = engines.load(flow, backend=durable_store.backend, book=book)
    # When it runs, the engine fails with an error naming that atom and field
    with pytest.raises(exc.SerializationFailure, match=r"'locky'.*'results'"):
        engine.run()
    # And what is stored is a valid record: the failure, then the revert
    fd = _load_fd(durable_store, engine.storage.flow_uuid)
    ads = {ad.name: ad for ad in fd}
    assert fd.state == states.REVERTED
    assert ads["locky"].state == states.REVERTED
    assert ads["locky"].failure.check(exc.SerializationFailure) is not None
    assert "locky" in ads["locky"].failure.exception_str
    assert ads["first"].state == states.REVERTED


def _lockstep_flow(prefix: str, barrier: threading.Barrier, length: int) -> lf.Flow:
    class Meet(task.Task):
        def execute(self, **inputs):
            # Both engines are inside a task at the same time, every step.
            barrier.wait(BARRIER_TIMEOUT_S)
            return f"{self.name}:{sorted(inputs.values())}"

    flow = lf.Flow(f"lockstep-{prefix}")
    previous = []
    for i in range(length):
        flow.add(Meet(f"{prefix}{i}", provides=f"{prefix}{i}", requires=previous))
        previous = [f"{prefix}{i}"]
    return flow


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "dir", "zookeeper"])
def test_two_engines_share_one_backend(kind, tmp_path, request):
    # Given one backend object (SQL, directory, ZooKeeper) and two flows in lockstep
    store = Store(kind, store_url(kind, tmp_path, request))
    try:
        length = 8
        barrier = threading.Barrier(2)
        loaded = [
            engines.load(
                _lockstep_flow(p, barrier, length),
                backend=store.backend,
                book=models.LogBook(f"book-{p}"),
            )
            for p in ("x", "y")
        ]
        errors = []

        def run(engine):
            try:
                engine.run()
            except BaseException as e:  # reported below
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=run, args=(e,)) for e in loaded]
        # When both run at once
        for t in threads:
            t.start()
        for t in threads:
            t.join(BARRIER_TIMEOUT_S * length)
        assert not errors and not any(t.is_alive() for t in threads)
        # Then each flow detail holds exactly its own atoms and results
        for prefix, engine in zip(("x", "y"), loaded):
            fd = _load_fd(store, engine.storage.flow_uuid)
            assert fd.state == states.SUCCESS
            names = sorted(_results(fd))
            assert names == sorted(f"{prefix}{i}" for i in range(length))
            assert _results(fd)[f"{prefix}1"] == f"{prefix}1:['{prefix}0:[]']"
    finally:
        store.close()


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
@pytest.mark.parametrize("kind", ["dir", "sqlite", "zookeeper"])
def test_two_processes_write_one_store_at_once(kind, tmp_path, request):
    # Given two engine processes writing to the same store
    store = Store(kind, store_url(kind, tmp_path, request))
    effects = os.path.join(tmp_path, "effects")
    length = 25
    children = [Child("chain", store.url, effects, prefix, str(length)) for prefix in ("p", "q")]
    try:
        # When both run to completion
        uuids = [c.wait_for("FLOW ").split()[1] for c in children]
        for c in children:
            c.release()
        assert [c.finish() for c in children] == [states.SUCCESS, states.SUCCESS]
    finally:
        for c in children:
            c.close()
    # Then every atom of both flows is stored, with the right results
    for prefix, fd_uuid in zip(("p", "q"), uuids):
        results = _results(_load_fd(store, fd_uuid))
        assert results == {f"{prefix}-{i}": i + 1 for i in range(length)}
    counts = flows.executions(effects)
    assert len(counts) == 2 * length and set(counts.values()) == {1}
    store.close()


def test_storage_keeps_memory_equal_to_the_backend_on_refused_values(durable_store):
    from flowengine.storage import Storage

    # Given a storage over a JSON backend with one task and one injected value
    book, fd = p_utils.temporary_flow_detail(durable_store.backend)
    storage = Storage(fd, backend=durable_store.backend)
    storage.ensure_atom(_Undo("t"))
    storage.set_atom_state("t", states.RUNNING)
    storage.inject({"kept": 1})
    # When a result and an injected value that cannot be stored are saved
    with pytest.raises(exc.SerializationFailure, match="'t'"):
        storage.save("t", threading.Lock())
    with pytest.raises(exc.SerializationFailure, match="_TaskFlow_INJECTOR"):
        storage.inject({"lock": threading.Lock()})
    # Then memory still matches what is stored, and saving goes on normally
    assert storage.get_atom_state("t") == states.RUNNING
    assert storage.fetch_all() == {"kept": 1}
    storage.save("t", "fine")
    stored = {ad.name: ad for ad in _load_fd(durable_store, fd.uuid)}
    assert stored["t"].results == "fine" and stored["t"].state == states.SUCCESS
    assert stored[storage.injector_name].results == {"kept": 1}
