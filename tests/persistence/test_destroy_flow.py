"""``destroy_flow_details``: one flow detail goes, its logbook and siblings stay."""

from __future__ import annotations

import contextlib

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import models


def _book_of_two() -> models.LogBook:
    book = models.LogBook("two-flows")
    for i in range(2):
        fd = models.FlowDetail(f"flow-{i}", models.generate_uuid())
        fd.state = states.SUCCESS
        for j in range(2):
            ad = models.TaskDetail(f"task-{i}-{j}", models.generate_uuid())
            ad.state = states.SUCCESS
            ad.results = j
            fd.add(ad)
        book.add(fd)
    return book


def test_destroying_one_flow_detail_keeps_the_logbook_and_the_other_flow(store):
    # Given a logbook holding two flow details
    book = _book_of_two()
    gone, kept = list(book)
    with contextlib.closing(store.backend.get_connection()) as conn:
        conn.save_logbook(book)
        # When one flow detail is destroyed
        conn.destroy_flow_details(gone.uuid)
    # Then a new backend object over the same data no longer has it nor its atoms
    with contextlib.closing(store.open().get_connection()) as conn:
        with pytest.raises(exc.NotFound):
            conn.get_flow_details(gone.uuid)
        for ad in gone:
            with pytest.raises(exc.NotFound):
                conn.get_atom_details(ad.uuid)
        # And the logbook lists only the other flow, whose atoms are all there
        assert [fd.uuid for fd in conn.get_flows_for_book(book.uuid)] == [kept.uuid]
        assert sorted(ad.uuid for ad in conn.get_flow_details(kept.uuid)) == sorted(
            ad.uuid for ad in kept
        )
        assert [fd.uuid for fd in conn.get_logbook(book.uuid)] == [kept.uuid]


def test_destroying_an_unknown_flow_detail_raises_not_found(store):
    with contextlib.closing(store.backend.get_connection()) as conn:
        with pytest.raises(exc.NotFound, match="no-such-flow"):
            conn.destroy_flow_details("no-such-flow")


def test_a_flow_detail_saved_without_a_logbook_can_be_destroyed(store):
    fd = models.FlowDetail("orphan", models.generate_uuid())
    fd.state = states.PENDING
    with contextlib.closing(store.backend.get_connection()) as conn:
        conn.update_flow_details(fd, ignore_missing=True)
        conn.destroy_flow_details(fd.uuid)
        with pytest.raises(exc.NotFound):
            conn.get_flow_details(fd.uuid)
