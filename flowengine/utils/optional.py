"""Optional dependencies: which extra installs each, and the error that says so.

A plain ``pip install flowengine`` runs every engine on every broker. Parts
that need more (SQL persistence, ZooKeeper) import their dependencies through
:func:`missing_extra`, so a user who lacks them reads the exact command that
fixes it instead of a bare ``No module named 'sqlalchemy'``.
"""

from __future__ import annotations

from flowengine import exceptions as exc

#: extra name -> what it is for, as the error message names it.
EXTRAS = {
    "sql": "SQL persistence and jobboards (sqlite://, postgresql://, mysql://)",
    "zookeeper": "ZooKeeper persistence and jobboards (zookeeper://)",
    "etcd": "The etcd jobboard (etcd://)",
    "metrics": "Prometheus metrics (flowengine worker --metrics-port)",
    "dashboard": "The web dashboard (flowengine dashboard)",
    "otel": "OpenTelemetry traces of flows (flowengine.tracing)",
    "taskflow-compat": "Jobboards in TaskFlow's own layout (compat='taskflow')",
}


def missing_extra(extra: str, error: ImportError) -> exc.MissingExtra:
    """The error to raise (``from error``) when ``extra``'s dependency failed to import."""
    what = EXTRAS[extra]
    module = error.name or str(error)
    return exc.MissingExtra(
        f"{what} needs the {module!r} package, which is not installed:"
        f" pip install 'flowengine[{extra}]'",
        name=error.name,
    )
