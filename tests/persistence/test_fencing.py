"""Fenced writes on every persistence backend: a newer claim's fence refuses older writers.

The check must be atomic with the write (see flowengine.persistence.fencing),
so these tests use two backend objects over the same data, as two
conductor processes would.
"""

from __future__ import annotations

import contextlib

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import fencing, models


def _saved_flow(backend) -> tuple[models.LogBook, models.FlowDetail, models.TaskDetail]:
    book = models.LogBook("book")
    fd = models.FlowDetail("flow", models.generate_uuid())
    ad = models.TaskDetail("task", models.generate_uuid())
    fd.add(ad)
    book.add(fd)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.save_logbook(book)
    return book, fd, ad


def _state_of(backend, ad_uuid: str) -> str | None:
    with contextlib.closing(backend.get_connection()) as conn:
        return conn.get_atom_details(ad_uuid).state


def test_every_backend_supports_fencing(store):
    assert fencing.supports_fencing(store.backend)


def test_writes_pass_while_the_fence_is_ours(store):
    _book, fd, ad = _saved_flow(store.backend)
    mine = fencing.FencedBackend(store.backend, fencing.Fence(fd.uuid, 5))
    mine.advance()
    ad.state = states.RUNNING
    with contextlib.closing(mine.get_connection()) as conn:
        conn.update_atom_details(ad)
    assert _state_of(store.open(), ad.uuid) == states.RUNNING


def test_a_newer_claim_fences_out_the_older_writer(store):
    # Given an old claimer (token 5) and a newer one (token 7) on another backend object
    _book, fd, ad = _saved_flow(store.backend)
    old = fencing.FencedBackend(store.backend, fencing.Fence(fd.uuid, 5))
    old.advance()
    new = fencing.FencedBackend(store.open(), fencing.Fence(fd.uuid, 7))
    # When the newer one advances the fence
    new.advance()
    # Then every write of the older one is refused, naming both claims
    ad.state = states.SUCCESS
    with contextlib.closing(old.get_connection()) as conn:
        with pytest.raises(exc.FencedOut, match="claim 5 was superseded by claim 7"):
            conn.update_atom_details(ad)
        with pytest.raises(exc.FencedOut):
            conn.update_flow_details(fd)
    # And nothing it wrote landed; the newer one still writes
    assert _state_of(store.open(), ad.uuid) is None
    ad.state = states.FAILURE
    with contextlib.closing(new.get_connection()) as conn:
        conn.update_atom_details(ad)
    assert _state_of(store.open(), ad.uuid) == states.FAILURE


def test_advancing_below_the_fence_is_refused(store):
    _book, fd, _ad = _saved_flow(store.backend)
    fencing.FencedBackend(store.backend, fencing.Fence(fd.uuid, 9)).advance()
    with pytest.raises(exc.FencedOut):
        fencing.FencedBackend(store.open(), fencing.Fence(fd.uuid, 3)).advance()


def test_fences_are_per_flow_detail(store):
    _b1, fd1, ad1 = _saved_flow(store.backend)
    _b2, fd2, ad2 = _saved_flow(store.backend)
    fencing.FencedBackend(store.backend, fencing.Fence(fd1.uuid, 9)).advance()
    other = fencing.FencedBackend(store.backend, fencing.Fence(fd2.uuid, 2))
    other.advance()
    ad2.state = states.RUNNING
    with contextlib.closing(other.get_connection()) as conn:
        conn.update_atom_details(ad2)
    assert _state_of(store.open(), ad2.uuid) == states.RUNNING
