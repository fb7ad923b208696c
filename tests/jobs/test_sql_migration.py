"""A PostgreSQL board connects even when its migration pauses longer than a lease.

The board's sessions carry an idle-in-transaction bound of one lease, so that
a claimer paused with row locks held does not block the others for longer.
Its migration reflects the schema in one transaction of many statements; on
a loaded machine (CI runs tests beside busy loops) a pause between two of them
outlasted a 1 s lease and the server ended the session, failing connect().
Here such a pause is made on purpose: a statement of the migration waits
longer than the lease before it is sent.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa

from tests.jobs.boards import Boards

pytestmark = [pytest.mark.broker]

LEASE_S = 0.3
#: The pause, well over the lease's idle bound.
PAUSE_S = 3 * LEASE_S


def test_a_migration_pausing_longer_than_a_lease_still_connects_the_board(pg_url):
    catalogue_reads: list[str] = []

    def pause_inside_the_migration(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # The second catalogue read in a transaction (the first began it)
        # comes after a pause: the fault itself, not a synchronisation.
        if "pg_catalog" in statement and conn.in_transaction():
            catalogue_reads.append(statement)
            if len(catalogue_reads) == 2:
                time.sleep(PAUSE_S)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", pause_inside_the_migration)
    boards = Boards("postgresql", pg_url)
    try:
        board = boards.make(lease_s=LEASE_S)
        assert len(catalogue_reads) >= 2, "the migration paused nowhere"
        job = board.post("after-a-slow-migration")
        assert [j.uuid for j in board.iterjobs()] == [job.uuid]
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", pause_inside_the_migration)
        boards.close()
