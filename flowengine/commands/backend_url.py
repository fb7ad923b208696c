"""``--backend URL`` of the commands: which persistence backend, checked before use.

Accepted: ``dir:PATH`` / ``file:PATH`` (also ``dir:///abs/path``),
``sqlite:///PATH``, ``postgresql://...`` and ``mysql://...`` (with an
optional ``+driver``). The memory backend (and an in-memory SQLite
database) lives inside one process, so a command run in another process
would see nothing: it is refused. A URL with a password is only ever shown
with the password masked.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib import parse

from flowengine.commands.errors import CommandError
from flowengine.utils.misc import mask_password

#: Environment variable read when ``--backend`` is not given (keeps a
#: database password out of the process list).
BACKEND_ENV = "FLOWENGINE_BACKEND"

_PATH_SCHEMES = ("dir", "file")
_SQL_SCHEMES = ("sqlite", "postgresql", "mysql")
_EXAMPLES = "dir:PATH, sqlite:///PATH or postgresql://USER@HOST/DB"
_SQLITE_IN_MEMORY = ("", ":memory:")


@dataclass(frozen=True)
class BackendURL:
    """A checked ``--backend`` value: the backend configuration and how to show it."""

    #: 'dir' or 'sql'.
    kind: str
    #: Configuration for ``persistence.backends.fetch``.
    conf: dict[str, Any]
    #: The URL with any password masked.
    safe: str
    #: The directory (dir backend) or database file (SQLite) holding the data.
    local_path: str | None = None


def parse_url(url: str | None) -> BackendURL:
    """Check ``url`` (or ``$FLOWENGINE_BACKEND``); CommandError saying what is wrong."""
    url = url or os.environ.get(BACKEND_ENV)
    if not url:
        raise CommandError(f"no backend: pass --backend URL ({_EXAMPLES}) or set ${BACKEND_ENV}")
    safe = mask_password(url)
    scheme, sep, rest = url.partition(":")
    scheme = scheme.lower()
    if not sep or not scheme.replace("+", "").isalnum():
        raise CommandError(
            f"{safe!r} is not a backend URL: use {_EXAMPLES}"
            + (f" (dir:{url} for a directory)" if "/" in url else "")
        )
    family = scheme.split("+", 1)[0]
    if family == "memory":
        raise CommandError(
            "the memory backend lives inside one process and each"
            " flowengine command is a new one: use a durable backend"
            f" ({_EXAMPLES})"
        )
    if family in _PATH_SCHEMES:
        return _dir_url(url, safe)
    if family in _SQL_SCHEMES:
        return _sql_url(url, safe, family)
    raise CommandError(f"unknown backend {scheme!r} in {safe!r}: use {_EXAMPLES}")


def _dir_url(url: str, safe: str) -> BackendURL:
    parts = parse.urlsplit(url)
    # 'dir:///abs' and 'dir:/abs' give '/abs'; 'dir:rel' and 'dir://rel' give 'rel'.
    path = parse.unquote(parts.netloc + parts.path)
    if not path:
        raise CommandError(f"{safe!r} names no directory: use dir:PATH")
    conf: dict[str, Any] = {key: values[-1] for key, values in parse.parse_qs(parts.query).items()}
    path = os.path.abspath(path)
    conf.update(connection="dir", path=path)
    return BackendURL("dir", conf, safe, local_path=path)


def _sql_url(url: str, safe: str, family: str) -> BackendURL:
    if family != "sqlite":
        if "://" not in url:
            raise CommandError(f"{safe!r} names no server: use {family}://USER@HOST/DB")
        return BackendURL("sql", {"connection": url}, safe)
    parts = parse.urlsplit(url)
    if "://" not in url or parts.netloc:
        raise CommandError(
            f"{safe!r} is not an SQLite file URL: use sqlite:///PATH (three slashes, then the path)"
        )
    # 'sqlite:///rel.db' -> 'rel.db', 'sqlite:////abs.db' -> '/abs.db', 'sqlite://' -> ''.
    database = parse.unquote(parts.path[1:])
    if database in _SQLITE_IN_MEMORY or database.startswith("file::memory:"):
        raise CommandError(
            f"{safe!r} is an in-memory database, gone when the process ends: use sqlite:///PATH"
        )
    return BackendURL("sql", {"connection": url}, safe, local_path=os.path.abspath(database))


@contextlib.contextmanager
def opened(url: BackendURL, create: bool = False) -> Iterator[Any]:
    """The backend, its structure created (``create``) or checked, closed afterwards.

    Without ``create`` nothing is written: a missing directory or database
    file, or one without flowengine's data, is a CommandError. Raises
    MissingExtra (naming the ``pip install`` to run) for SQL without the
    ``sql`` extra.
    """
    from flowengine import exceptions as exc
    from flowengine.persistence import backends

    if not create:
        _check_exists(url)
    backend = backends.fetch(url.conf)
    try:
        try:
            if not create and url.kind == "sql":
                _check_tables(url, backend)
            with contextlib.closing(backend.get_connection()) as conn:
                if create:
                    conn.upgrade()
                else:
                    conn.validate()
                    # SQL: the tables are there, but maybe of an older flowengine.
                    check_schema = getattr(conn, "check_schema", None)
                    if check_schema is not None:
                        check_schema()
        except exc.StorageFailure as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise CommandError(f"cannot use {url.safe}: {first}") from e
        yield backend
    finally:
        backend.close()


def _check_exists(url: BackendURL) -> None:
    path = url.local_path
    if path is None:
        return
    if url.kind == "dir":
        # The directory backend creates its tree when connected: look first,
        # so that a mistyped path is reported instead of filled.
        if not os.path.isdir(os.path.join(path, "books")):
            why = "no such directory" if not os.path.exists(path) else "not a flowengine store"
            raise CommandError(f"no flows in {url.safe}: {why} ({path})")
    elif not os.path.isfile(path):
        raise CommandError(f"no flows in {url.safe}: no such database file ({path})")


def _check_tables(url: BackendURL, backend: Any) -> None:
    import sqlalchemy as sa

    try:
        found = sa.inspect(backend.engine).has_table("flowdetails")
    except sa.exc.SQLAlchemyError as e:
        first = str(e).splitlines()[0]
        raise CommandError(f"cannot use {url.safe}: {first}") from e
    if not found:
        raise CommandError(f"no flows in {url.safe}: the database has no flowengine tables")
