"""TaskFlow's module name for :mod:`flowengine.persistence.helpers` (a re-export).

The helpers build persistence records, so they live in the persistence layer;
this module stays because TaskFlow programs import them by this name. It is
the one ``flowengine.utils`` module allowed to import upward (see
tests/unit/test_layers.py).
"""

from __future__ import annotations

from flowengine.persistence.helpers import (
    create_flow_detail,
    temporary_flow_detail,
    temporary_log_book,
)

__all__ = ["create_flow_detail", "temporary_flow_detail", "temporary_log_book"]
