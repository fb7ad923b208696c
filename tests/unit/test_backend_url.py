"""``--backend URL`` parsing: what each form becomes, what is refused and why."""

from __future__ import annotations

import os

import pytest

from flowengine.commands import backend_url
from flowengine.commands.errors import CommandError
from flowengine.utils.misc import mask_password


@pytest.mark.parametrize(
    "url, path",
    [
        ("dir:/srv/flows", "/srv/flows"),
        ("dir:///srv/flows", "/srv/flows"),
        ("file:/srv/flows", "/srv/flows"),
        ("dir:flows", os.path.abspath("flows")),
        ("DIR:flows", os.path.abspath("flows")),
    ],
)
def test_directory_forms(url, path):
    parsed = backend_url.parse_url(url)
    assert (parsed.kind, parsed.local_path) == ("dir", path)
    assert parsed.conf == {"connection": "dir", "path": path}


def test_directory_options_come_from_the_query():
    parsed = backend_url.parse_url("dir:/srv/flows?fsync=false")
    assert parsed.conf == {"connection": "dir", "path": "/srv/flows", "fsync": "false"}


@pytest.mark.parametrize(
    "url, path",
    [
        ("sqlite:///flows.db", os.path.abspath("flows.db")),
        ("sqlite:////srv/flows.db", "/srv/flows.db"),
        ("sqlite+pysqlite:////srv/flows.db", "/srv/flows.db"),
    ],
)
def test_sqlite_forms(url, path):
    parsed = backend_url.parse_url(url)
    assert (parsed.kind, parsed.local_path, parsed.conf) == ("sql", path, {"connection": url})


def test_server_urls_pass_through_with_the_password_masked():
    parsed = backend_url.parse_url("postgresql+psycopg://app:s3cret@db.example:5432/flows")
    assert parsed.conf == {"connection": "postgresql+psycopg://app:s3cret@db.example:5432/flows"}
    assert parsed.safe == "postgresql+psycopg://app:***@db.example:5432/flows"
    assert parsed.local_path is None


def test_the_environment_is_the_default(monkeypatch):
    monkeypatch.setenv(backend_url.BACKEND_ENV, "dir:/srv/flows")
    assert backend_url.parse_url(None).local_path == "/srv/flows"
    monkeypatch.delenv(backend_url.BACKEND_ENV)
    with pytest.raises(CommandError, match=r"no backend: pass --backend URL"):
        backend_url.parse_url(None)


@pytest.mark.parametrize(
    "url",
    [
        "memory",
        "memory:",
        "memory://",
        "sqlite://",
        "sqlite:///:memory:",
        "postgresql:db",
        "sqlite://host/x",
    ],
)
def test_what_another_process_could_not_share_or_reach_is_refused(url):
    with pytest.raises(CommandError):
        backend_url.parse_url(url)


@pytest.mark.parametrize(
    "url, masked",
    [
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("redis://:pw@localhost:6379/0", "redis://:***@localhost:6379/0"),
        ("postgresql://app:pw@db/flows", "postgresql://app:***@db/flows"),
        ("amqp://u:pw@h1//;amqp://u:pw2@h2//", "amqp://u:***@h1//;amqp://u:***@h2//"),
        ("redis://[::1", "<unparsable URL>"),
    ],
)
def test_mask_password_hides_only_a_password_that_is_there(url, masked):
    assert mask_password(url) == masked
