"""Corrupt or foreign data in a backend is reported precisely, naming the record."""

from __future__ import annotations

import contextlib
import json
import os

import pytest
import sqlalchemy as sa

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.persistence import models
from tests.persistence import flows
from tests.persistence.stores import Store, store_url


def _saved_flow(store, tmp_path):
    """Run a small flow to completion; return (flow uuid, uuid of its atom 'b')."""
    engine = engines.load(
        flows.make_flow(os.path.join(tmp_path, "effects")),
        backend=store.backend,
        book=models.LogBook("book"),
    )
    engine.run()
    ad_uuid = engine.storage.get_atom_uuid("b")
    return engine.storage.flow_uuid, ad_uuid


def _read_flow(store, fd_uuid):
    with contextlib.closing(store.open().get_connection()) as conn:
        return conn.get_flow_details(fd_uuid)


@pytest.fixture
def dir_store(tmp_path, request):
    s = Store("dir", store_url("dir", tmp_path, request))
    yield s
    s.close()


def _atom_file(store, ad_uuid):
    return os.path.join(store.backend.base_path, "atom_details", ad_uuid, "metadata")


def _edit_json(path, change):
    with open(path) as fp:
        data = json.load(fp)
    change(data)
    with open(path, "w") as fp:
        json.dump(data, fp)


def test_dir_hand_edited_invalid_json_names_the_file(dir_store, tmp_path):
    fd_uuid, ad_uuid = _saved_flow(dir_store, tmp_path)
    path = _atom_file(dir_store, ad_uuid)
    with open(path) as fp:
        text = fp.read()
    with open(path, "w") as fp:
        fp.write(text[:-5])  # truncated by a careless editor
    with pytest.raises(exc.InvalidFormat, match=f"{ad_uuid}.*not valid JSON"):
        _read_flow(dir_store, fd_uuid)


@pytest.mark.parametrize(
    "change, error, pattern",
    [
        (
            lambda d: d["atom"].update(format_version=99),
            exc.IncompatibleVersion,
            "TaskDetail data \\(uuid '{uuid}'\\) has format_version 99",
        ),
        (
            lambda d: d["atom"].pop("name"),
            exc.InvalidFormat,
            "TaskDetail data \\(uuid '{uuid}'\\) is missing required key 'name'",
        ),
        (
            lambda d: d.update(type="MYSTERY_DETAIL"),
            exc.InvalidFormat,
            "Unknown atom type 'MYSTERY_DETAIL'",
        ),
        (
            lambda d: d["atom"].update(failure={"bogus": True}),
            exc.InvalidFormat,
            "TaskDetail '{uuid}'",
        ),
    ],
    ids=["future-version", "missing-name", "unknown-type", "bad-failure"],
)
def test_dir_foreign_record_is_refused(dir_store, tmp_path, change, error, pattern):
    fd_uuid, ad_uuid = _saved_flow(dir_store, tmp_path)
    _edit_json(_atom_file(dir_store, ad_uuid), change)
    with pytest.raises(error, match=pattern.format(uuid=ad_uuid)):
        _read_flow(dir_store, fd_uuid)


def test_dir_stores_taskflows_dicts_and_reads_older_flowengines(dir_store, tmp_path):
    # Given a flow saved now: its files hold TaskFlow's dicts, no format_version
    fd_uuid, ad_uuid = _saved_flow(dir_store, tmp_path)
    flow_file = os.path.join(dir_store.backend.base_path, "flow_details", fd_uuid, "metadata")
    with open(_atom_file(dir_store, ad_uuid)) as fp:
        assert models.FORMAT_VERSION_KEY not in json.load(fp)["atom"]
    with open(flow_file) as fp:
        assert models.FORMAT_VERSION_KEY not in json.load(fp)
    # When the files are as an older flowengine wrote them (format_version 1 in each)
    _edit_json(
        _atom_file(dir_store, ad_uuid), lambda d: d["atom"].update({models.FORMAT_VERSION_KEY: 1})
    )
    _edit_json(flow_file, lambda d: d.update({models.FORMAT_VERSION_KEY: 1}))
    # Then they read back as before, and to_dict() has no format_version
    fd = _read_flow(dir_store, fd_uuid)
    assert fd.find(ad_uuid).state == "SUCCESS"
    assert models.FORMAT_VERSION_KEY not in fd.to_dict()
    assert models.FORMAT_VERSION_KEY not in fd.find(ad_uuid).to_dict()


def test_dir_corrupt_logbook_is_refused(dir_store, tmp_path):
    book = models.LogBook("book")
    with contextlib.closing(dir_store.backend.get_connection()) as conn:
        conn.save_logbook(book)
    path = os.path.join(dir_store.backend.base_path, "books", book.uuid, "metadata")
    _edit_json(path, lambda d: d.update(created_at="yesterday-ish"))
    with (
        contextlib.closing(dir_store.open().get_connection()) as conn,
        pytest.raises(exc.InvalidFormat, match=f"LogBook '{book.uuid}'.*'yesterday-ish'"),
    ):
        conn.get_logbook(book.uuid)


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_store(request, tmp_path):
    s = Store(request.param, store_url(request.param, tmp_path, request))
    yield s
    s.close()


def _sql(store, statement, **params):
    with store.backend.engine.begin() as conn:
        conn.execute(sa.text(statement), params)


@pytest.mark.parametrize(
    "column, value, error, pattern",
    [
        (
            "results",
            "{not json",
            exc.InvalidFormat,
            "table 'atomdetails', row uuid '{uuid}', column 'results'.*not valid JSON",
        ),
        (
            "format_version",
            99,
            exc.IncompatibleVersion,
            "Row uuid '{uuid}' of table 'atomdetails' has format_version 99",
        ),
        (
            "atom_type",
            "MYSTERY_DETAIL",
            exc.InvalidFormat,
            "Row uuid '{uuid}' of table 'atomdetails'.*Unknown atom type 'MYSTERY_DETAIL'",
        ),
        ("failure", '{"bogus": true}', exc.InvalidFormat, "TaskDetail '{uuid}'"),
    ],
    ids=["bad-json", "future-version", "unknown-type", "bad-failure"],
)
def test_sql_foreign_row_is_refused(sql_store, tmp_path, column, value, error, pattern):
    fd_uuid, ad_uuid = _saved_flow(sql_store, tmp_path)
    statement = f"UPDATE atomdetails SET {column} = :v WHERE uuid = :u"
    if sql_store.kind == "postgresql" and column == "results":
        # Documents are JSON columns there (TaskFlow's layout): the server
        # itself refuses text that is not JSON, so none can be read back.
        with pytest.raises(sa.exc.DataError, match="invalid input syntax for type json"):
            _sql(sql_store, statement, v=value, u=ad_uuid)
        return
    _sql(sql_store, statement, v=value, u=ad_uuid)
    with pytest.raises(error, match=pattern.format(uuid=ad_uuid)):
        _read_flow(sql_store, fd_uuid)


def test_sql_corrupt_flow_meta_names_the_row(sql_store, tmp_path):
    fd_uuid, _ = _saved_flow(sql_store, tmp_path)
    if sql_store.kind == "postgresql":  # a JSON column: refused by the server (see above)
        with pytest.raises(sa.exc.DataError, match="invalid input syntax for type json"):
            _sql(sql_store, "UPDATE flowdetails SET meta = '[1,' WHERE uuid = :u", u=fd_uuid)
        return
    _sql(sql_store, "UPDATE flowdetails SET meta = '[1,' WHERE uuid = :u", u=fd_uuid)
    with pytest.raises(
        exc.InvalidFormat, match=f"table 'flowdetails', row uuid '{fd_uuid}', column 'meta'"
    ):
        _read_flow(sql_store, fd_uuid)


def test_sql_schema_missing_is_a_clear_error(tmp_path):
    from flowengine.persistence import backends

    be = backends.fetch(f"sqlite:///{tmp_path}/never-upgraded.db")
    try:
        with contextlib.closing(be.get_connection()) as conn:
            with pytest.raises(exc.StorageFailure, match="call upgrade"):
                conn.get_logbook("x")
            with pytest.raises(exc.StorageFailure, match="call upgrade"):
                conn.check_schema()
            conn.upgrade()
            conn.check_schema()
    finally:
        be.close()
