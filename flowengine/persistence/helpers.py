"""Helpers to create logbooks and flow details (optionally saved to a backend).

TaskFlow programs reach them as ``flowengine.utils.persistence_utils``
(TaskFlow's module name), which re-exports this module.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from flowengine.persistence import models

__all__ = ["create_flow_detail", "temporary_flow_detail", "temporary_log_book"]

LOG = logging.getLogger(__name__)


def _save(backend: Any, book: models.LogBook) -> None:
    with contextlib.closing(backend.get_connection()) as conn:
        conn.save_logbook(book)


def temporary_log_book(backend: Any = None) -> models.LogBook:
    """Create a logbook named 'tmp' (saved to ``backend`` if given)."""
    book = models.LogBook("tmp")
    if backend is not None:
        _save(backend, book)
    return book


def temporary_flow_detail(
    backend: Any = None, meta: dict[str, Any] | None = None
) -> tuple[models.LogBook, models.FlowDetail]:
    """Create a 'tmp-flow-detail' flow detail in a temporary logbook: ``(book, detail)``."""
    flow_id = models.generate_uuid()
    book = temporary_log_book(backend)
    flow_detail = models.FlowDetail(name="tmp-flow-detail", uuid=flow_id)
    if meta is not None:
        flow_detail.meta.update(meta)
    book.add(flow_detail)
    if backend is not None:
        _save(backend, book)
    return book, flow_detail


def create_flow_detail(
    flow: Any,
    book: models.LogBook | None = None,
    backend: Any = None,
    meta: dict[str, Any] | None = None,
) -> models.FlowDetail:
    """Create a flow detail named after ``flow`` (added to ``book``, saved to ``backend``).

    With a backend but no book a temporary logbook is created (and a warning logged).
    """
    flow_id = models.generate_uuid()
    flow_name = getattr(flow, "name", None)
    if flow_name is None:
        LOG.warning("No name provided for flow %s (id %s)", flow, flow_id)
        flow_name = flow_id
    flow_detail = models.FlowDetail(name=flow_name, uuid=flow_id)
    if meta is not None:
        flow_detail.meta.update(meta)
    if backend is not None and book is None:
        LOG.warning("No logbook provided for flow %s, creating one.", flow)
        book = temporary_log_book(backend)
    if book is None:
        return flow_detail
    book.add(flow_detail)
    if backend is not None:
        _save(backend, book)
    return book.find(flow_id) or flow_detail
