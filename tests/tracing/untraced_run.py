"""Runs flows in a process where OpenTelemetry looks uninstalled (``--hide``) or not.

Usage: ``python -m tests.tracing.untraced_run [--hide]``. Runs a flow on the
serial engine and one on the worker-based engine (memory transport, a worker
in a thread), then prints JSON: the results, the opentelemetry modules
loaded, and the imports of opentelemetry that were attempted.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
import threading
from typing import Any

#: Names of the modules OpenTelemetry's packages provide.
HIDDEN_PREFIX = "opentelemetry"


class HideOpenTelemetry(importlib.abc.MetaPathFinder):
    """Makes every ``opentelemetry`` import fail as if the package were not installed."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == HIDDEN_PREFIX or name.startswith(HIDDEN_PREFIX + "."):
            self.attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def run_flows() -> dict[str, Any]:
    from flowengine import engines
    from flowengine.engines.worker_based.worker_side import worker as wk
    from flowengine.patterns import linear_flow
    from tests.tracing import traced_tasks as tt

    local = engines.run(linear_flow.Flow("local").add(tt.Pack("pack", provides="box")))
    worker = wk.Worker("untraced", "t", [tt.Pack], transport="memory")
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    try:
        assert worker.wait(30.0), "worker did not start"
        remote = engines.run(
            linear_flow.Flow("remote").add(tt.Pack("pack", provides="box")),
            engine="worker-based",
            exchange="untraced",
            topics=["t"],
            transport="memory",
        )
    finally:
        worker.stop()
        thread.join(30.0)
    return {"local": local, "remote": remote}


def main() -> None:
    hider = HideOpenTelemetry()
    if "--hide" in sys.argv:
        sys.meta_path.insert(0, hider)
    results = run_flows()
    print(
        json.dumps(
            {
                "results": results,
                "loaded": sorted(m for m in sys.modules if m.split(".")[0] == HIDDEN_PREFIX),
                "attempts": hider.attempts,
            }
        )
    )


if __name__ == "__main__":
    main()
