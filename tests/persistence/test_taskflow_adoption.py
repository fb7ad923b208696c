"""flowengine adopts TaskFlow 6.5's stored state, and TaskFlow keeps reading it.

On each backend an operator keeps across the switch (SQLite, PostgreSQL,
dir, ZooKeeper; memory lives in one process), TaskFlow 6.5 writes first
(its own ``upgrade()``, its own engine), flowengine upgrades and reads what
it wrote, resumes the flow TaskFlow left RUNNING, runs one of its own while
TaskFlow keeps writing, and TaskFlow reads everything last (and, on SQL, runs
its ``upgrade()`` again). The other way round, TaskFlow reads and resumes
what flowengine wrote. Both libraries run in this process, on the same store.
Skipped without TaskFlow (the ``interop`` extra).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from flowengine import exceptions as exc
from flowengine.persistence.backends.sql import migration

pytest.importorskip("taskflow", reason="TaskFlow is not installed (pip install -e .[interop])")

KINDS = ("sqlite", "postgresql", "dir", "zookeeper")
SQL_KINDS = ("sqlite", "postgresql")
#: How many times each (library, task) executed, to tell a resume from a rerun.
RUNS: Counter[tuple[str, str]] = Counter()


class Stop(BaseException):
    """Stands for a process killed mid-flow: engines do not catch it, the flow stays RUNNING."""


def _lib(lib: str, module: str) -> Any:
    return importlib.import_module(f"{lib}.{module}")


def make_flow(lib: str, name: str, stop: bool = False, fail: bool = False) -> Any:
    """``first`` then ``second`` (which needs first's result).

    ``stop``: second raises Stop (the flow stays RUNNING); ``fail``: second
    raises ValueError('boom') and first's revert returns 'undone' (REVERTED).
    """
    task, lf = _lib(lib, "task"), _lib(lib, "patterns.linear_flow")

    class First(task.Task):
        default_provides = "made"

        def execute(self) -> dict[str, Any]:
            RUNS[lib, f"{name}.first"] += 1
            return {"n": 20, "text": f"from {lib}"}

        def revert(self, *args: Any, **kwargs: Any) -> str:
            return "undone"

    class Second(task.Task):
        default_provides = "total"

        def execute(self, made: dict[str, Any]) -> int:
            RUNS[lib, f"{name}.second"] += 1
            if stop:
                raise Stop()
            if fail:
                raise ValueError("boom")
            return int(made["n"]) + 1

    return lf.Flow(name).add(First("first"), Second("second"))


@contextlib.contextmanager
def _connection(lib: str, conf: dict[str, Any], upgrade: bool = False) -> Iterator[Any]:
    backend = _lib(lib, "persistence.backends").fetch(dict(conf))
    try:
        with contextlib.closing(backend.get_connection()) as conn:
            if upgrade:
                conn.upgrade()
            yield backend, conn
    finally:
        backend.close()


def run_flow(
    lib: str,
    conf: dict[str, Any],
    book_name: str,
    flow_name: str,
    stop: bool = False,
    fail: bool = False,
) -> tuple[str, str]:
    """Run a new flow on ``lib`` in a new logbook; (book uuid, flow detail uuid)."""
    models = _lib(lib, "persistence.models")
    with _connection(lib, conf) as (backend, conn):
        book = models.LogBook(book_name)
        fd = models.FlowDetail(flow_name, uuid=str(uuid.uuid4()))
        book.add(fd)
        conn.save_logbook(book)
        engine = _lib(lib, "engines").load(
            make_flow(lib, flow_name, stop, fail), flow_detail=fd, book=book, backend=backend
        )
        try:
            engine.run()
        except (Stop, ValueError):
            pass
    return book.uuid, fd.uuid


def resume_flow(lib: str, conf: dict[str, Any], book_uuid: str, fd_uuid: str) -> None:
    """Load a stored flow detail in ``lib`` and run its flow to the end."""
    with _connection(lib, conf) as (backend, conn):
        book = conn.get_logbook(book_uuid)
        fd = book.find(fd_uuid)
        _lib(lib, "engines").load(
            make_flow(lib, fd.name), flow_detail=fd, book=book, backend=backend
        ).run()


def _atom(ad: Any) -> tuple[Any, ...]:
    """An atom detail's state, results, failure (message, types) and revert results."""
    failure = ad.failure
    if failure is not None:
        as_dict = failure.to_dict()
        failure = (as_dict["exception_str"], list(as_dict["exc_type_names"]))
    return ad.state, ad.results, failure, ad.revert_results


def stored(lib: str, conf: dict[str, Any]) -> dict[str, Any]:
    """What ``lib`` reads back: {book: {flow: (state, {atom: _atom(...)})}}."""
    with _connection(lib, conf) as (_backend, conn):
        return {
            book.name: {fd.name: (fd.state, {ad.name: _atom(ad) for ad in fd}) for fd in book}
            for book in conn.get_logbooks()
        }


def done(made_by: str) -> tuple[str, dict[str, Any]]:
    """What a flow that ran to the end stores (``made_by`` ran its first task)."""
    return (
        "SUCCESS",
        {
            "first": ("SUCCESS", {"n": 20, "text": f"from {made_by}"}, None, None),
            "second": ("SUCCESS", 21, None, None),
        },
    )


def reverted(made_by: str) -> tuple[str, dict[str, Any]]:
    """What a flow whose second task failed stores, once reverted."""
    return (
        "REVERTED",
        {
            "first": ("REVERTED", {"n": 20, "text": f"from {made_by}"}, None, "undone"),
            "second": ("REVERTED", None, ("boom", ["ValueError", "Exception"]), None),
        },
    )


@pytest.fixture
def pg_database(pg_url: str) -> Iterator[str]:
    """A new, empty PostgreSQL database of this test's own (URL with psycopg 3)."""
    url = sa.engine.make_url(pg_url).set(drivername="postgresql+psycopg")
    name = f"adopt_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture(params=KINDS)
def shared(request: pytest.FixtureRequest, tmp_path: Any) -> dict[str, Any]:
    """One store's configuration, the same for TaskFlow and flowengine (TaskFlow's keys)."""
    kind = request.param
    if kind == "sqlite":
        return {"connection": f"sqlite:///{tmp_path}/shared.db"}
    if kind == "postgresql":
        return {"connection": request.getfixturevalue("pg_database")}
    if kind == "dir":
        return {"connection": "dir", "path": str(tmp_path / "shared")}
    return {
        "connection": "zookeeper",
        "hosts": request.getfixturevalue("zk_hosts"),
        "path": f"/adopt-{uuid.uuid4().hex}",
    }


def _is_sql(conf: dict[str, Any]) -> bool:
    return "://" in conf["connection"]


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_taskflow_first_flowengine_resumes_taskflow_reads_last(shared):
    # Given TaskFlow 6.5 created the store, ran one flow to the end and was
    # stopped in the middle of another (its second task RUNNING)
    with _connection("taskflow", shared, upgrade=True):
        pass
    run_flow("taskflow", shared, "tf-done", "tf_done")
    run_flow("taskflow", shared, "tf-reverted", "tf_reverted", fail=True)
    stopped = run_flow("taskflow", shared, "tf-stopped", "tf_stopped", stop=True)
    as_taskflow_wrote = stored("taskflow", shared)
    assert as_taskflow_wrote["tf-stopped"]["tf_stopped"] == (
        "RUNNING",
        {
            "first": ("SUCCESS", {"n": 20, "text": "from taskflow"}, None, None),
            "second": ("RUNNING", None, None, None),
        },
    )

    # When flowengine upgrades the store, it reads exactly what TaskFlow wrote
    with _connection("flowengine", shared, upgrade=True) as (_backend, conn):
        conn.validate()
        if _is_sql(shared):  # ...at flowengine's schema revision
            conn.check_schema()
    assert stored("flowengine", shared) == as_taskflow_wrote

    # ...resumes the stopped flow where TaskFlow left it (first is not rerun)
    RUNS.clear()
    resume_flow("flowengine", shared, *stopped)
    assert RUNS == Counter({("flowengine", "tf_stopped.second"): 1})
    # ...and runs its own while TaskFlow keeps writing to the same store
    run_flow("flowengine", shared, "fe-done", "fe_done")
    run_flow("flowengine", shared, "fe-reverted", "fe_reverted", fail=True)
    run_flow("taskflow", shared, "tf-during", "tf_during")

    # Then both read every flow, finished, with every result, TaskFlow last
    expected = {
        "tf-done": {"tf_done": done("taskflow")},
        "tf-reverted": {"tf_reverted": reverted("taskflow")},
        "tf-stopped": {"tf_stopped": done("taskflow")},
        "fe-done": {"fe_done": done("flowengine")},
        "fe-reverted": {"fe_reverted": reverted("flowengine")},
        "tf-during": {"tf_during": done("taskflow")},
    }
    assert stored("flowengine", shared) == expected
    assert stored("taskflow", shared) == expected
    # ...and TaskFlow's own upgrade() still succeeds on the adopted store
    with _connection("taskflow", shared, upgrade=True):
        pass
    assert stored("taskflow", shared) == expected


def test_flowengine_first_taskflow_resumes_and_reads(shared):
    # Given flowengine created the store, ran a flow and was stopped in another
    with _connection("flowengine", shared, upgrade=True):
        pass
    run_flow("flowengine", shared, "fe-done", "fe_done")
    run_flow("flowengine", shared, "fe-reverted", "fe_reverted", fail=True)
    stopped = run_flow("flowengine", shared, "fe-stopped", "fe_stopped", stop=True)

    # When TaskFlow 6.5 upgrades the same store (rolling back), resumes the flow
    with _connection("taskflow", shared, upgrade=True):
        pass
    RUNS.clear()
    resume_flow("taskflow", shared, *stopped)
    assert RUNS == Counter({("taskflow", "fe_stopped.second"): 1})

    # Then each reads what the other wrote
    expected = {
        "fe-done": {"fe_done": done("flowengine")},
        "fe-reverted": {"fe_reverted": reverted("flowengine")},
        "fe-stopped": {"fe_stopped": done("flowengine")},
    }
    assert stored("taskflow", shared) == expected
    assert stored("flowengine", shared) == expected


# SQL specifics: the schema, how old flowengine and old TaskFlow schemas are handled.


@pytest.fixture(params=SQL_KINDS)
def sql_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A fresh SQLite file or PostgreSQL database (psycopg 3 URL, both libraries accept it)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/fresh.db"
    return str(request.getfixturevalue("pg_database"))


def _layout(url: str) -> dict[str, dict[str, str]]:
    """{table: {column: type name}} of the record tables (lengths aside)."""
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        return {
            table: {c["name"]: type(c["type"]).__name__ for c in inspector.get_columns(table)}
            for table in ("logbooks", "flowdetails", "atomdetails")
        }
    finally:
        engine.dispose()


def _taskflow_revision(url: str) -> str | None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


def test_flowengines_tables_are_taskflows_plus_format_version(sql_url, tmp_path):
    # Given a database flowengine created and one TaskFlow 6.5 created
    with _connection("flowengine", {"connection": sql_url}, upgrade=True):
        pass
    ours = _layout(sql_url)
    theirs = _layout_of_taskflow(sql_url, tmp_path)
    # Then flowengine's record tables have TaskFlow's columns and types, plus
    # format_version only (PostgreSQL: TaskFlow's two enums are VARCHAR here)
    theirs["atomdetails"].update(
        (name, "VARCHAR") for name, kind in theirs["atomdetails"].items() if kind == "ENUM"
    )
    for table, columns in theirs.items():
        extra = {name: kind for name, kind in ours[table].items() if name not in columns}
        assert extra == {"format_version": "INTEGER"}, table
        assert {name: ours[table][name] for name in columns} == columns, table
    # ...and TaskFlow's revision is recorded where TaskFlow's upgrade() looks
    assert _taskflow_revision(sql_url) == "00af93df9d77"


def _layout_of_taskflow(ours_url: str, tmp_path: Any) -> dict[str, dict[str, str]]:
    """The layout of a database TaskFlow 6.5 creates beside ``ours_url``."""
    url = sa.engine.make_url(ours_url)
    if url.get_backend_name() == "sqlite":
        theirs = f"sqlite:///{tmp_path}/taskflow.db"
        with _connection("taskflow", {"connection": theirs}, upgrade=True):
            pass
        return _layout(theirs)
    name = f"{url.database}_tf"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        theirs = url.set(database=name).render_as_string(hide_password=False)
        with _connection("taskflow", {"connection": theirs}, upgrade=True):
            pass
        return _layout(theirs)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def _sql(url: str, statement: str, **params: Any) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement), params)
    finally:
        engine.dispose()


def test_a_flowengine_database_at_0004_is_migrated_without_losing_rows(sql_url):
    # Given a database of an earlier flowengine (revision 0004) holding a
    # logbook, a flow detail and an atom detail in that release's layout
    engine = sa.create_engine(sql_url)
    with engine.begin() as conn:
        migration.db_sync(conn, "0004")
    engine.dispose()
    _sql(
        sql_url,
        "INSERT INTO logbooks (uuid, name, meta, created_at, format_version)"
        " VALUES ('b1', 'old-book', :meta, :when, 1)",
        meta='{"k":1}',
        when=datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
    )
    _sql(
        sql_url,
        "INSERT INTO flowdetails (uuid, parent_uuid, name, state, meta,"
        " format_version) VALUES ('f1', 'b1', 'old_flow', 'SUCCESS', '{}', 1)",
    )
    _sql(
        sql_url,
        "INSERT INTO atomdetails (uuid, parent_uuid, name, atom_type, state,"
        " intention, version, results, meta, format_version) VALUES ('a1', 'f1', 'first',"
        " 'TASK_DETAIL', 'SUCCESS', 'EXECUTE', :version, :results, :meta, 1)",
        version='"1.0"',
        results='{"n":20}',
        meta='{"progress":1.0}',
    )
    _sql(
        sql_url,
        "INSERT INTO atomdetails (uuid, parent_uuid, name, atom_type, state,"
        " intention, version, results, meta, format_version) VALUES ('a2', 'f1', 'second',"
        " 'TASK_DETAIL', 'SUCCESS', 'EXECUTE', :version, :results, :meta, 1)",
        version="[1,10]",
        results="21",
        meta='{"progress":1.0}',
    )

    # When this flowengine upgrades it
    with _connection("flowengine", {"connection": sql_url}, upgrade=True) as (_b, conn):
        conn.check_schema()

    # Then both libraries read every row as it was written
    expected = {
        "old-book": {
            "old_flow": (
                "SUCCESS",
                {
                    "first": ("SUCCESS", {"n": 20}, None, None),
                    "second": ("SUCCESS", 21, None, None),
                },
            )
        }
    }
    assert stored("flowengine", {"connection": sql_url}) == expected
    assert stored("taskflow", {"connection": sql_url}) == expected
    for lib in ("flowengine", "taskflow"):
        with _connection(lib, {"connection": sql_url}) as (_b, conn):
            book = conn.get_logbook("b1")
            versions = [conn.get_atom_details(uuid).version for uuid in ("a1", "a2")]
        assert (book.meta, versions) == ({"k": 1}, ["1.0", "1.10"]), lib
        assert book.created_at.replace(tzinfo=None) == datetime.datetime(2025, 1, 2, 3, 4, 5)
    # ...and TaskFlow's upgrade() finds its revision there
    with _connection("taskflow", {"connection": sql_url}, upgrade=True):
        pass
    assert _taskflow_revision(sql_url) == "00af93df9d77"


def _taskflow_database(url: str) -> None:
    with _connection("taskflow", {"connection": url}, upgrade=True):
        pass


def _older_taskflow_database(url: str) -> None:
    """A database at a TaskFlow revision older than 6.5's head (3162c0f3f8e4)."""
    if url.startswith("sqlite"):
        # TaskFlow's SQLite schema records no revision: write one as an older
        # TaskFlow run through alembic would have.
        _taskflow_database(url)
        _sql(url, "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        _sql(url, "INSERT INTO alembic_version VALUES ('3162c0f3f8e4')")
        return
    tf_migration = _lib("taskflow", "persistence.backends.sqlalchemy.migration")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        tf_migration.db_sync(conn, "3162c0f3f8e4")
    engine.dispose()


def test_an_older_taskflow_schema_is_refused_with_what_to_do(sql_url):
    # Given a TaskFlow database at a revision older than TaskFlow 6.5's
    _older_taskflow_database(sql_url)
    conf = {"connection": sql_url}
    # Then flowengine's upgrade() refuses it, saying what to run first
    with pytest.raises(
        exc.StorageFailure,
        match="revision '3162c0f3f8e4', older than TaskFlow 6.5's"
        " '00af93df9d77': run TaskFlow 6.5's upgrade",
    ):
        with _connection("flowengine", conf, upgrade=True):
            pass
    # ...and once that ran (PostgreSQL: TaskFlow's own migrations), adopts it
    if not sql_url.startswith("sqlite"):
        with _connection("taskflow", conf, upgrade=True):
            pass
        run_flow("taskflow", conf, "tf-done", "tf_done")
        with _connection("flowengine", conf, upgrade=True) as (_backend, conn):
            conn.check_schema()
        assert stored("flowengine", conf) == {"tf-done": {"tf_done": done("taskflow")}}


def test_tables_of_someone_else_are_not_migrated(tmp_path):
    # Given a database whose 'logbooks' table is neither TaskFlow's nor flowengine's
    url = f"sqlite:///{tmp_path}/other.db"
    _sql(url, "CREATE TABLE logbooks (id INTEGER PRIMARY KEY, title TEXT)")
    # Then upgrade() refuses to touch it, naming what is missing
    with pytest.raises(
        exc.StorageFailure,
        match=r"not a\s+TaskFlow 6.5 schema either"
        r" \(missing logbooks.created_at",
    ):
        with _connection("flowengine", {"connection": url}, upgrade=True):
            pass


#: A TaskFlow-style writer in another process: takes the item's lock (lockf,
#: as fasteners does), leaves half the file written until told to go on.
_HALF_WRITER = """
import fcntl, sys
item = sys.argv[1]
with open(item + '/lock', 'a') as lock:
    fcntl.lockf(lock, fcntl.LOCK_EX)
    document = open(item + '/metadata').read()
    with open(item + '/metadata', 'w') as out:
        out.write(document[:10]); out.flush()
        print('half', flush=True)
        sys.stdin.readline()
        out.write(document[10:])
"""
#: How long the reader is given to (wrongly) read the half-written file.
READER_CHANCE_S = 1.0


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_dir_reads_wait_for_taskflows_item_lock(tmp_path):
    # Given a flow detail TaskFlow wrote, being rewritten in place by a
    # TaskFlow process that holds the item's lock half-way through
    conf = {"connection": "dir", "path": str(tmp_path / "shared")}
    _book, fd_uuid = run_flow("taskflow", conf, "tf-book", "tf_flow")
    item = str(tmp_path / "shared" / "flow_details" / fd_uuid)
    writer = subprocess.Popen(
        [sys.executable, "-c", _HALF_WRITER, item],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline().strip() == "half"
        # When flowengine reads it meanwhile
        read: list[Any] = []
        with _connection("flowengine", conf) as (_backend, conn):
            reader = threading.Thread(
                target=lambda: read.append(conn.get_flow_details(fd_uuid, lazy=True))
            )
            reader.start()
            reader.join(READER_CHANCE_S)
            # Then it waits for the lock instead of reading half a document
            assert reader.is_alive() and read == []
            writer.stdin.write("go\n")
            writer.stdin.flush()
            reader.join(30)
        assert [fd.name for fd in read] == ["tf_flow"]
    finally:
        writer.kill()
        writer.wait()


#: Bound on the start barrier and the joins of the concurrent-adoption test.
BARRIER_TIMEOUT_S = 20.0


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_engines_starting_at_once_adopt_a_taskflow_database_once(sql_url):
    # Given a database TaskFlow 6.5 created and wrote a flow to
    _taskflow_database(sql_url)
    conf = {"connection": sql_url}
    run_flow("taskflow", conf, "tf-done", "tf_done")
    # When four flowengine engines upgrade it at the same moment
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def upgrade() -> None:
        try:
            backend = _lib("flowengine", "persistence.backends").fetch(dict(conf))
            try:
                barrier.wait(BARRIER_TIMEOUT_S)
                with contextlib.closing(backend.get_connection()) as conn:
                    conn.upgrade()
                    conn.check_schema()
            finally:
                backend.close()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=upgrade) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BARRIER_TIMEOUT_S * 2)
    # Then each succeeds, the schema is at flowengine's head, nothing was lost
    assert errors == [] and not any(thread.is_alive() for thread in threads)
    engine = sa.create_engine(sql_url)
    with engine.connect() as conn:
        assert migration.current_revision(conn) == migration.head_revision()
    engine.dispose()
    assert stored("flowengine", conf) == {"tf-done": {"tf_done": done("taskflow")}}
