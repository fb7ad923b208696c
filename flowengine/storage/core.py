"""The :class:`Storage` class, assembled from one mixin per concern."""

from __future__ import annotations

from flowengine.storage.atoms import AtomDetailsMixin
from flowengine.storage.fetching import FetchingMixin
from flowengine.storage.flow import FlowDetailMixin
from flowengine.storage.injection import InjectionMixin
from flowengine.storage.plans import ArgPlanMixin
from flowengine.storage.results import ResultsMixin
from flowengine.storage.retries import RetryHistoryMixin


class Storage(
    FlowDetailMixin,
    AtomDetailsMixin,
    ResultsMixin,
    RetryHistoryMixin,
    InjectionMixin,
    FetchingMixin,
    ArgPlanMixin,
):
    """Interface between engines and a flow detail (and its backend).

    Atoms are addressed by name. Results are read back through the symbols
    atoms declare (``save_as``), injected values and atom-scoped injected
    arguments, following TaskFlow's precedence rules.
    """
