"""Engines run flows: ``load``/``run`` a flow in the 'serial', 'parallel' or
'worker-based' engine (TaskFlow's ``taskflow.engines`` API)."""

from flowengine.engines.helpers import (
    ENGINE_DEFAULT,
    ENGINES_NAMESPACE,
    flow_from_detail,
    load,
    load_from_detail,
    load_from_factory,
    run,
    save_factory_details,
)

__all__ = [
    "ENGINES_NAMESPACE",
    "ENGINE_DEFAULT",
    "flow_from_detail",
    "load",
    "load_from_detail",
    "load_from_factory",
    "run",
    "save_factory_details",
]
