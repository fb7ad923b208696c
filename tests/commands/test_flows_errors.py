"""The ``flows`` commands' mistakes: one line on stderr naming the cause, no traceback."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from urllib import parse

import pytest

from flowengine.persistence import backends, models
from tests.commands.flows_helpers import ROOT, env, flowengine

# Out of the fast tier (tests/fast_tier.py): runs `flowengine` commands in processes of their own.
pytestmark = pytest.mark.broker


@pytest.mark.parametrize(
    "url, says",
    [
        ("memory://", "the memory backend lives inside one process"),
        ("memory:", "the memory backend lives inside one process"),
        ("sqlite://", "is an in-memory database"),
        ("sqlite:///:memory:", "is an in-memory database"),
        (
            "/var/lib/flows",
            "'/var/lib/flows' is not a backend URL: use dir:PATH, sqlite:///PATH"
            " or postgresql://USER@HOST/DB (dir:/var/lib/flows for a directory)",
        ),
        ("redis://localhost/0", "unknown backend 'redis' in 'redis://localhost/0'"),
        ("sqlite:flows.db", "is not an SQLite file URL: use sqlite:///PATH"),
        ("dir:", "names no directory"),
    ],
)
def test_a_bad_backend_url_is_one_line(url, says):
    proc = flowengine("flows", "list", "--backend", url)
    assert proc.returncode == 2
    assert proc.stderr.startswith("flowengine flows list: ")
    assert says in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_missing_store_is_reported_not_created(tmp_path):
    for url, says in (
        (f"dir:{tmp_path}/nowhere", "no such directory"),
        (f"sqlite:///{tmp_path}/none.db", "no such database file"),
    ):
        proc = flowengine("flows", "list", "--backend", url)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_password_is_never_shown(pg_url, tmp_path, request):
    # Given the session's server (emptied) with a password in its URL (trust auth ignores it)
    from tests.persistence.stores import store_url

    store_url("postgresql", tmp_path, request)
    user, _, host = parse.urlsplit(pg_url).netloc.rpartition("@")
    url = parse.urlunsplit(
        parse.urlsplit(pg_url)._replace(netloc=f"{user or 'flowengine'}:s3cret@{host}")
    )
    # When a command names an unknown flow there
    proc = flowengine("flows", "show", "abc", "--backend", url)
    # Then the URL in the message has its password masked
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"flowengine flows show: no flow detail 'abc' in"
        f" postgresql://{user or 'flowengine'}:***@{host}/postgres\n"
    )


def _seed(url, uuids):
    """Flow details with chosen uuids, in logbook 'seeded'."""
    be = backends.fetch(url)
    try:
        with contextlib.closing(be.get_connection()) as conn:
            conn.upgrade()
            book = models.LogBook("seeded")
            for uuid in uuids:
                fd = models.FlowDetail("seeded-flow", uuid)
                fd.state = "SUCCESS"
                book.add(fd)
            conn.save_logbook(book)
    finally:
        be.close()


def test_unknown_and_ambiguous_flows_are_one_line(tmp_path):
    url = f"sqlite:///{tmp_path}/flows.db"
    first, second = ("abcd0000-0000-4000-8000-000000000001", "abcd1111-0000-4000-8000-000000000002")
    _seed(url, [first, second])
    unknown = flowengine("flows", "show", "ffff", "--backend", url)
    assert unknown.returncode == 2
    assert unknown.stderr == f"flowengine flows show: no flow detail 'ffff' in {url}\n"
    ambiguous = flowengine("flows", "resume", "abcd", "--backend", url)
    assert ambiguous.returncode == 2
    assert ambiguous.stderr.startswith(
        "flowengine flows resume: 'abcd' is ambiguous: 2 flow details start with it ("
    )
    assert first in ambiguous.stderr and second in ambiguous.stderr
    assert "give more of the uuid" in ambiguous.stderr
    assert len(ambiguous.stderr.splitlines()) == 1
    # One more character is enough; the flow records no factory, which is said too
    no_factory = flowengine("flows", "retry", "abcd1", "--backend", url)
    assert no_factory.returncode == 2 and "is already SUCCESS" in no_factory.stderr
    # -v adds the traceback
    verbose = flowengine("flows", "show", "ffff", "--backend", url, "-v")
    assert "Traceback" in verbose.stderr and "CommandError" in verbose.stderr


def test_delete_needs_a_flow_or_a_book_not_both(tmp_path):
    url = f"dir:{tmp_path}/store"
    for args in ([], ["abc", "--book", "x"]):
        proc = flowengine("flows", "delete", *args, "--backend", url)
        assert proc.returncode == 2 and "a FLOW or --book NAME (not both)" in proc.stderr


def test_run_book_without_a_backend_is_refused(monkeypatch):
    proc = flowengine(
        "run", "tests.commands.ledger_flows:steps", "--book", "x", "--store", "ledger=/dev/null"
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "flowengine run: --book needs a backend: --backend URL or $FLOWENGINE_BACKEND\n"
    )


_WITHOUT_SQLALCHEMY = """
import sys
sys.modules["sqlalchemy"] = None  # as if the 'sql' extra were not installed
from flowengine import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_sql_without_the_sql_extra_names_the_pip_command(tmp_path):
    (tmp_path / "flows.db").write_bytes(b"")
    for argv in (
        ["flows", "list", "--backend", f"sqlite:///{tmp_path}/flows.db"],
        [
            "run",
            "tests.commands.ledger_flows:steps",
            "--no-progress",
            "--backend",
            f"sqlite:///{tmp_path}/flows.db",
        ],
    ):
        proc = subprocess.run(
            [sys.executable, "-c", _WITHOUT_SQLALCHEMY, *argv],
            capture_output=True,
            text=True,
            env=env(),
            cwd=ROOT,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
        assert "pip install 'flowengine[sql]'" in proc.stderr


def test_the_backend_can_come_from_the_environment(tmp_path):
    # Given $FLOWENGINE_BACKEND (a password stays out of the process list)
    backend = {"FLOWENGINE_BACKEND": f"sqlite:///{tmp_path}/flows.db"}
    # When run and list are given no --backend
    run = flowengine(
        "run",
        "tests.commands.ledger_flows:steps",
        "--no-progress",
        "--store",
        f"ledger={tmp_path}/ledger",
        extra_env=backend,
    )
    listing = flowengine("flows", "list", "--json", extra_env=backend)
    # Then both use it: the run was saved, in a logbook named after the flow
    assert run.returncode == 0, run.stderr
    assert listing.returncode == 0, listing.stderr
    assert [(b["name"], len(b["flows"])) for b in json.loads(listing.stdout)] == [("steps", 1)]
    # And without either, a command says what it needs
    bare = flowengine("flows", "list")
    assert bare.returncode == 2 and "no backend: pass --backend URL" in bare.stderr
