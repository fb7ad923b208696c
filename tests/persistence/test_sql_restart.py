"""The SQL backend after its PostgreSQL server restarted: the first write succeeds."""

from __future__ import annotations

import contextlib

from flowengine.persistence import backends, models


def test_first_write_after_a_server_restart_succeeds(private_pg):
    # Given a backend whose pool holds a connection to the server
    with backends.backend(private_pg.url) as be:
        with contextlib.closing(be.get_connection()) as conn:
            conn.save_logbook(models.LogBook("before"))
        # When the server crashes and comes back
        private_pg.restart()
        # Then the next write goes through (the dead pooled connection is replaced)
        book = models.LogBook("after")
        with contextlib.closing(be.get_connection()) as conn:
            conn.save_logbook(book)
            assert conn.get_logbook(book.uuid).name == "after"
