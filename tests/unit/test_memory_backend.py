"""Memory backend, the fake filesystem behind it, and backend lookup."""

import contextlib
import threading

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import backends, helpers, models
from flowengine.persistence.backends import impl_memory
from flowengine.types import failure as ft


def _book_with_atoms(n_atoms=2):
    book = models.LogBook("book")
    fd = models.FlowDetail("flow", models.generate_uuid())
    for i in range(n_atoms):
        ad = models.TaskDetail(f"t{i}", models.generate_uuid())
        ad.state = states.PENDING
        fd.add(ad)
    book.add(fd)
    return book, fd


@pytest.fixture
def conn():
    backend = impl_memory.MemoryBackend()
    with contextlib.closing(backend.get_connection()) as connection:
        yield connection


def test_save_and_load_logbook(conn):
    book, fd = _book_with_atoms()
    conn.save_logbook(book)
    loaded = conn.get_logbook(book.uuid)
    assert loaded is not book
    assert loaded.name == "book"
    loaded_fd = loaded.find(fd.uuid)
    assert sorted(ad.name for ad in loaded_fd) == ["t0", "t1"]
    lazy = conn.get_logbook(book.uuid, lazy=True)
    assert len(lazy) == 0
    assert [b.uuid for b in conn.get_logbooks()] == [book.uuid]


def test_deep_copy_isolates_stored_values(conn):
    book, fd = _book_with_atoms(1)
    ad = next(iter(fd))
    ad.results = {"x": [1]}
    conn.save_logbook(book)
    ad.results["x"].append(2)
    assert conn.get_atom_details(ad.uuid).results == {"x": [1]}


def test_update_atom_details_and_failure_round_trip(conn):
    book, fd = _book_with_atoms(1)
    conn.save_logbook(book)
    ad = next(iter(fd))
    try:
        raise ValueError("bad")
    except ValueError:
        ad.put(states.FAILURE, ft.Failure())
    conn.update_atom_details(ad)
    loaded = conn.get_atom_details(ad.uuid)
    assert loaded.state == states.FAILURE
    assert loaded.failure.check(ValueError) is not None


def test_update_unknown_atom_raises_not_found(conn):
    ad = models.TaskDetail("t", models.generate_uuid())
    with pytest.raises(exc.NotFound):
        conn.update_atom_details(ad)
    conn.update_atom_details(ad, ignore_missing=True)
    assert conn.get_atom_details(ad.uuid).name == "t"


def test_update_flow_details_keeps_atoms_absent_from_partial_copy(conn):
    book, fd = _book_with_atoms(2)
    conn.save_logbook(book)
    partial = fd.copy(retain_contents=False)
    partial.state = states.RUNNING
    conn.update_flow_details(partial)
    loaded = conn.get_flow_details(fd.uuid)
    assert loaded.state == states.RUNNING
    assert len(loaded) == 2


def test_missing_things_raise_not_found(conn):
    for call in (
        lambda: conn.get_logbook("nope"),
        lambda: conn.get_flow_details("nope"),
        lambda: conn.get_atom_details("nope"),
        lambda: list(conn.get_flows_for_book("nope")),
        lambda: conn.destroy_logbook("nope"),
    ):
        with pytest.raises(exc.NotFound, match="nope"):
            call()


def test_destroy_logbook_and_clear_all(conn):
    book, fd = _book_with_atoms(2)
    conn.save_logbook(book)
    other, _ = _book_with_atoms(1)
    conn.save_logbook(other)
    conn.destroy_logbook(book.uuid)
    with pytest.raises(exc.NotFound):
        conn.get_flow_details(fd.uuid)
    assert [b.uuid for b in conn.get_logbooks()] == [other.uuid]
    conn.clear_all()
    assert list(conn.get_logbooks()) == []
    conn.validate()


def test_non_copyable_values_become_storage_failure(conn):
    book, fd = _book_with_atoms(1)
    next(iter(fd)).results = threading.Lock()
    with pytest.raises(exc.StorageFailure):
        conn.save_logbook(book)


def test_filesystem_ls_pformat_and_links():
    fs = impl_memory.FakeFilesystem()
    fs.ensure_path("/a/b/c")
    fs["/a/b/c"] = "d"
    fs.ensure_path("/e")
    fs.symlink("/a/b/c", "/e/link")
    assert fs["/e/link"] == "d"
    assert fs.ls("/a") == ["b"]
    assert fs.ls("/a", absolute=True) == ["/a/b"]
    # Breadth first, each node's children newest first (TaskFlow's order).
    assert fs.ls_r("/") == ["e", "a", "e/link", "a/b", "a/b/c"]
    assert fs.ls_r("/a", absolute=True) == ["/a/b", "/a/b/c"]
    assert fs.pformat() == "\n".join(
        [
            "/",
            "|__a",
            "|  |__b",
            "|     |__c",
            "|__e",
            "   |__link (link to /a/b/c)",
        ]
    )
    assert fs.get("/nope", "blob") == "blob"
    with pytest.raises(ValueError):
        fs.delete("/a")
    del fs["/a"]
    assert fs.ls("/") == ["e"]
    assert fs.get("/e/link") is None  # dangling link reads as missing
    with pytest.raises(ValueError):
        fs.normpath("relative/path")


def test_backend_memory_layout_via_pformat():
    backend = impl_memory.MemoryBackend()
    book, fd = _book_with_atoms(1)
    with contextlib.closing(backend.get_connection()) as c:
        c.save_logbook(book)
    ad = next(iter(fd))
    assert backend.memory.ls("/") == ["books", "flow_details", "atom_details"]
    assert backend.memory.ls(f"/books/{book.uuid}") == [fd.uuid]
    text = backend.memory.pformat()
    assert f"{fd.uuid} (link to /flow_details/{fd.uuid})" in text
    assert f"{ad.uuid} (link to /atom_details/{ad.uuid})" in text


@pytest.mark.parametrize(
    "conf", ["memory://", "memory", {"connection": "memory://"}, "memory://?deep_copy=false"]
)
def test_fetch_by_url_and_dict(conf):
    backend = backends.fetch(conf)
    assert isinstance(backend, impl_memory.MemoryBackend)


def test_fetch_query_options_reach_backend():
    backend = backends.fetch("memory://?deep_copy=false")
    value = {"x": [1]}
    backend.memory.ensure_path("/v")
    backend.memory["/v/item"] = value
    assert backend.memory["/v/item"]["x"] is value["x"]  # shallow copies only


def test_fetch_unknown_backend():
    with pytest.raises(exc.NotFound, match="nosuch"):
        backends.fetch("nosuch://here")


def test_backend_context_manager_upgrades_and_closes():
    with backends.backend("memory://") as backend:
        with contextlib.closing(backend.get_connection()) as c:
            c.validate()
            assert list(c.get_logbooks()) == []


def test_persistence_utils():
    backend = impl_memory.MemoryBackend()
    book, fd = helpers.temporary_flow_detail(backend, meta={"m": 1})
    assert (book.name, fd.name, fd.meta) == ("tmp", "tmp-flow-detail", {"m": 1})
    with contextlib.closing(backend.get_connection()) as c:
        assert c.get_logbook(book.uuid).find(fd.uuid) is not None

    class Named:
        name = "my-flow"

    created = helpers.create_flow_detail(Named(), backend=backend)
    assert created.name == "my-flow"
    with contextlib.closing(backend.get_connection()) as c:
        assert len(list(c.get_logbooks())) == 2
    alone = helpers.create_flow_detail(Named())
    assert alone.name == "my-flow"
    assert helpers.temporary_log_book().name == "tmp"


def test_the_private_backend_of_a_storage_reads_back_what_the_engine_saved():
    # Given a flow run by an engine given no backend (its storage keeps the
    # atom details live in a private MemoryBackend and builds no node for them)
    from flowengine import engines, task
    from flowengine.patterns import linear_flow

    class Add(task.Task):
        def execute(self, x):
            return x + 1

    flow = linear_flow.Flow("f").add(
        Add("a", provides="y", rebind={"x": "x"}), Add("b", provides="z", rebind={"x": "y"})
    )
    engine = engines.load(flow, store={"x": 1})
    engine.run()
    backend = engine.storage.backend
    # When someone reads the backend
    with contextlib.closing(backend.get_connection()) as conn:
        fd = conn.get_flow_details(engine.storage.flow_uuid)
        by_name = {ad.name: ad for ad in fd}
        # Then it holds what the engine did, as formatted copies.
        assert (by_name["a"].state, by_name["a"].results) == ("SUCCESS", 2)
        assert (by_name["b"].state, by_name["b"].results) == ("SUCCESS", 3)
        assert by_name["b"].meta["progress"] == 1.0
        ad_b = conn.get_atom_details(by_name["b"].uuid)
        assert ad_b is not engine.storage._details["b"]  # a copy, not the live one
    uuids = {ad.uuid for ad in fd}
    assert uuids <= set(backend.memory.ls("/atom_details"))
    assert set(backend.memory.ls(f"/flow_details/{fd.uuid}")) == uuids
