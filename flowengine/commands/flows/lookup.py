"""Find logbooks and flow details from what a user types: a name, a uuid or its prefix."""

from __future__ import annotations

import contextlib
from typing import Any

from flowengine import exceptions as exc
from flowengine.commands.errors import CommandError

#: How many candidates an "ambiguous prefix" error names.
AMBIGUOUS_SHOWN = 5
#: Characters of a uuid shown where a short form is enough (as git shows hashes).
SHORT_UUID_CHARS = 8


def short(uuid: str) -> str:
    """The first characters of ``uuid``, enough to name it on the command line."""
    return uuid[:SHORT_UUID_CHARS]


def find_books(conn: Any, ref: str) -> list[Any]:
    """Logbooks (lazy) whose uuid is ``ref`` or whose name is ``ref``; [] if none."""
    books = list(conn.get_logbooks(lazy=True))
    by_uuid = [b for b in books if b.uuid == ref]
    return by_uuid or [b for b in books if b.name == ref]


def book_to_fill(backend: Any, ref: str) -> Any:
    """The logbook a new flow detail goes into: the one named (or with uuid) ``ref``, else a
    new one of that name (saved with the flow). CommandError if several share the name.

    The logbook comes lazy (no flow details): saving it with the new flow
    rewrites nothing another process may be writing.
    """
    from flowengine.persistence import models

    with contextlib.closing(backend.get_connection()) as conn:
        books = find_books(conn, ref)
    if len(books) > 1:
        raise CommandError(
            f"{len(books)} logbooks are named {ref!r}"
            f" ({', '.join(b.uuid for b in books)}): --book UUID picks one"
        )
    return books[0] if books else models.LogBook(ref)


def find_book(conn: Any, ref: str, safe_url: str) -> Any:
    """The one logbook named (or with uuid) ``ref``; CommandError if none or several."""
    books = find_books(conn, ref)
    if not books:
        raise CommandError(f"no logbook named {ref!r} in {safe_url}")
    if len(books) > 1:
        uuids = ", ".join(b.uuid for b in books)
        raise CommandError(
            f"{len(books)} logbooks are named {ref!r} ({uuids}): give the uuid of one"
        )
    return books[0]


def _is_uuid(text: str) -> bool:
    # Only a well-formed uuid reaches a backend as a key (never a path like '../x').
    return len(text) == 36 and all(c in "0123456789abcdef-" for c in text)


def find_flow(conn: Any, ref: str, safe_url: str) -> tuple[Any, Any]:
    """``(logbook or None, flow detail with its atoms)`` for a uuid or unique prefix.

    Raises CommandError when nothing matches or the prefix matches several.
    """
    ref = ref.strip().lower()
    if not ref:
        raise CommandError("no flow given: pass a flow detail uuid or its first characters")
    exact: list[tuple[Any, Any]] = []
    prefixed: list[tuple[Any, Any]] = []
    for book in conn.get_logbooks(lazy=True):
        for fd in conn.get_flows_for_book(book.uuid, lazy=True):
            uuid = fd.uuid.lower()
            if uuid == ref:
                exact.append((book, fd))
            elif uuid.startswith(ref):
                prefixed.append((book, fd))
    found = exact or prefixed
    if not found:
        # A flow detail saved without a logbook is found by its full uuid only.
        if _is_uuid(ref):
            with contextlib.suppress(exc.NotFound):
                return None, conn.get_flow_details(ref)
        raise CommandError(f"no flow detail {ref!r} in {safe_url}")
    if len(found) > 1:
        names = ", ".join(f"{fd.uuid} {fd.name!r}" for _, fd in found[:AMBIGUOUS_SHOWN])
        more = f" and {len(found) - AMBIGUOUS_SHOWN} more" if len(found) > AMBIGUOUS_SHOWN else ""
        raise CommandError(
            f"{ref!r} is ambiguous: {len(found)} flow details start with it"
            f" ({names}{more}); give more of the uuid"
        )
    book, fd = found[0]
    return book, conn.get_flow_details(fd.uuid)
