"""Backend conformance suite: every backend kind honours the same contract."""

from __future__ import annotations

import contextlib

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import backends, models
from flowengine.types import failure as ft


def _failure(message: str) -> ft.Failure:
    try:
        raise RuntimeError(message)
    except RuntimeError:
        return ft.Failure()


def _book(n_flows: int = 1, n_atoms: int = 2) -> models.LogBook:
    book = models.LogBook("book")
    book.meta = {"owner": "tests", "n": n_flows}
    for i in range(n_flows):
        fd = models.FlowDetail(f"flow-{i}", models.generate_uuid())
        fd.state = states.PENDING
        fd.meta = {"factory": {"name": "x.y", "args": [i], "kwargs": {}}}
        for j in range(n_atoms):
            ad = models.TaskDetail(f"task-{i}-{j}", models.generate_uuid())
            ad.state = states.SUCCESS
            ad.results = {"value": [i, j], "text": "é"}
            ad.version = "1.0"
            ad.meta = {"progress": 1.0}
            fd.add(ad)
        book.add(fd)
    return book


def _conn(store):
    return contextlib.closing(store.backend.get_connection())


def _atoms_by_name(fd: models.FlowDetail) -> dict[str, models.AtomDetail]:
    return {ad.name: ad for ad in fd}


def test_save_and_get_logbook_round_trip(store):
    # Given a logbook with two flows of two atoms each
    book = _book(n_flows=2)
    with _conn(store) as conn:
        conn.save_logbook(book)
    # When it is read back through a new backend object
    with contextlib.closing(store.open().get_connection()) as conn:
        loaded = conn.get_logbook(book.uuid)
    # Then everything saved comes back
    assert (loaded.name, loaded.uuid, loaded.meta) == (book.name, book.uuid, book.meta)
    assert loaded.created_at.replace(microsecond=0) == book.created_at.replace(microsecond=0)
    assert sorted(fd.uuid for fd in loaded) == sorted(fd.uuid for fd in book)
    for fd in book:
        got = loaded.find(fd.uuid)
        assert (got.name, got.state, got.meta) == (fd.name, fd.state, fd.meta)
        assert {ad.uuid for ad in got} == {ad.uuid for ad in fd}
        for ad in fd:
            got_ad = got.find(ad.uuid)
            assert type(got_ad) is models.TaskDetail
            assert (got_ad.name, got_ad.state, got_ad.results, got_ad.version, got_ad.meta) == (
                ad.name,
                ad.state,
                ad.results,
                ad.version,
                ad.meta,
            )


def test_failures_and_retry_history_round_trip(store):
    book = models.LogBook("book")
    fd = models.FlowDetail("flow", models.generate_uuid())
    book.add(fd)
    task = models.TaskDetail("task", models.generate_uuid())
    task.put(states.FAILURE, _failure("boom"))
    task.put(states.REVERT_FAILURE, _failure("revert boom"))
    retry = models.RetryDetail("retry", models.generate_uuid())
    retry.put(states.SUCCESS, 1)
    retry.results[-1][1]["task"] = _failure("first try")
    retry.put(states.SUCCESS, 2)
    fd.add(task)
    fd.add(retry)
    with _conn(store) as conn:
        conn.save_logbook(book)
        loaded = _atoms_by_name(conn.get_flow_details(fd.uuid))
    got_task, got_retry = loaded["task"], loaded["retry"]
    assert got_task.state == states.REVERT_FAILURE
    assert got_task.failure.exception_str == "boom"
    assert got_task.failure.check(RuntimeError) is RuntimeError
    assert got_task.revert_failure.exception_str == "revert boom"
    assert type(got_retry) is models.RetryDetail
    assert [r for r, _ in got_retry.results] == [1, 2]
    assert got_retry.results[0][1]["task"].exception_str == "first try"
    assert got_retry.results[1][1] == {}


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.get_logbook("nope"),
        lambda c: list(c.get_flows_for_book("nope")),
        lambda c: c.get_flow_details("nope"),
        lambda c: list(c.get_atoms_for_flow("nope")),
        lambda c: c.get_atom_details("nope"),
        lambda c: c.destroy_logbook("nope"),
        lambda c: c.update_atom_details(models.TaskDetail("t", "nope")),
        lambda c: c.update_flow_details(models.FlowDetail("f", "nope")),
    ],
    ids=[
        "get_logbook",
        "get_flows_for_book",
        "get_flow_details",
        "get_atoms_for_flow",
        "get_atom_details",
        "destroy_logbook",
        "update_atom_details",
        "update_flow_details",
    ],
)
def test_unknown_uuid_is_not_found(store, call):
    with _conn(store) as conn, pytest.raises(exc.NotFound, match="nope"):
        call(conn)


def test_update_keeps_children_absent_from_the_given_object(store):
    # Given a stored flow with two atoms
    book = _book(n_atoms=2)
    fd = next(iter(book))
    with _conn(store) as conn:
        conn.save_logbook(book)
        # When a copy holding only a new atom (and a new state) is saved
        partial = fd.copy(retain_contents=False)
        partial.state = states.RUNNING
        extra = models.TaskDetail("extra", models.generate_uuid())
        partial.add(extra)
        conn.update_flow_details(partial)
        # Then the flow has all three atoms and the new state
        got = conn.get_flow_details(fd.uuid)
    assert got.state == states.RUNNING
    assert sorted(_atoms_by_name(got)) == ["extra", "task-0-0", "task-0-1"]


def test_update_atom_details_changes_only_that_atom(store):
    book = _book(n_atoms=2)
    fd = next(iter(book))
    first, second = list(fd)
    with _conn(store) as conn:
        conn.save_logbook(book)
        first.put(states.FAILURE, _failure("nope"))
        conn.update_atom_details(first)
        got = conn.get_atom_details(first.uuid)
        other = conn.get_atom_details(second.uuid)
    assert got.state == states.FAILURE and got.failure.exception_str == "nope"
    assert got.results is None
    assert other.state == states.SUCCESS and other.results == second.results


def test_lazy_loading_and_listing(store):
    books = [_book(n_flows=2), _book(n_flows=1)]
    with _conn(store) as conn:
        for b in books:
            conn.save_logbook(b)
        assert sorted(b.uuid for b in conn.get_logbooks()) == sorted(b.uuid for b in books)
        assert all(len(b) == 0 for b in conn.get_logbooks(lazy=True))
        assert len(conn.get_logbook(books[0].uuid, lazy=True)) == 0
        assert sorted(len(b) for b in conn.get_logbooks()) == [1, 2]
        flows = list(conn.get_flows_for_book(books[0].uuid))
        assert sorted(fd.uuid for fd in flows) == sorted(fd.uuid for fd in books[0])
        assert all(len(fd) == 2 for fd in flows)
        fd_uuid = flows[0].uuid
        assert len(conn.get_flow_details(fd_uuid, lazy=True)) == 0
        assert len(list(conn.get_atoms_for_flow(fd_uuid))) == 2


def test_destroy_logbook_removes_its_contents_only(store):
    doomed, kept = _book(), _book()
    with _conn(store) as conn:
        conn.save_logbook(doomed)
        conn.save_logbook(kept)
        conn.destroy_logbook(doomed.uuid)
        with pytest.raises(exc.NotFound):
            conn.get_logbook(doomed.uuid)
        fd = next(iter(doomed))
        with pytest.raises(exc.NotFound):
            conn.get_flow_details(fd.uuid)
        with pytest.raises(exc.NotFound):
            conn.get_atom_details(next(iter(fd)).uuid)
        assert [b.uuid for b in conn.get_logbooks()] == [kept.uuid]
        assert len(conn.get_logbook(kept.uuid)) == 1


def test_clear_all_then_still_usable(store):
    with _conn(store) as conn:
        conn.save_logbook(_book())
        conn.clear_all()
        assert list(conn.get_logbooks()) == []
        conn.validate()
        book = _book()
        conn.save_logbook(book)
        assert conn.get_logbook(book.uuid).uuid == book.uuid


def test_upgrade_is_idempotent_and_validate_passes(store):
    with _conn(store) as conn:
        book = _book()
        conn.save_logbook(book)
        conn.upgrade()
        conn.upgrade()
        conn.validate()
        assert conn.get_logbook(book.uuid).uuid == book.uuid


def test_backend_context_manager_upgrades_and_closes(store):
    with backends.backend(store.url) as be:
        with contextlib.closing(be.get_connection()) as conn:
            conn.validate()
            book = _book()
            conn.save_logbook(book)
            assert conn.get_logbook(book.uuid).name == "book"


def test_unstorable_value_is_refused_before_anything_is_written(store):
    # Given a stored atom
    book = _book(n_atoms=1)
    ad = next(iter(next(iter(book))))
    with _conn(store) as conn:
        conn.save_logbook(book)
        # When its results become something JSON cannot hold
        ad.results = {"lock": object()}
        if store.kind == "memory":
            conn.update_atom_details(ad)  # kept as a Python object: allowed
            return
        with pytest.raises(exc.SerializationFailure) as info:
            conn.update_atom_details(ad)
        # Then the error names the record and field, and the stored record is intact
        assert "task-0-0" in str(info.value) and "'results'" in str(info.value)
        assert conn.get_atom_details(ad.uuid).results == {"value": [0, 0], "text": "é"}


def test_data_survives_closing_the_backend(durable_store):
    store = durable_store
    book = _book()
    with _conn(store) as conn:
        conn.save_logbook(book)
    store.backend.close()
    with contextlib.closing(store.open().get_connection()) as conn:
        assert len(conn.get_logbook(book.uuid)) == 1
