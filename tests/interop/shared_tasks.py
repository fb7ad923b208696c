"""Tasks and flows shared by TaskFlow and flowengine in the interop tests.

A mixed fleet routes by the fully qualified task class name, so each task
must have the *same* name on both sides while deriving from each side's own
``Task``. In a real migration that comes for free: ``myapp.tasks.Add`` keeps
its module path and only its import line changes between the old and the new
release. Here both releases live in one checkout, so the base library is
chosen per process by ``FLOWENGINE_INTEROP_LIBRARY`` (``taskflow`` or
``flowengine``, the default), and :func:`build` makes either set of classes
(with this module's name) for tests that need both in one process.
"""

from __future__ import annotations

import importlib
import os
import types
from typing import Any

#: Environment variable choosing the library the module-level classes use.
LIBRARY_ENV = "FLOWENGINE_INTEROP_LIBRARY"
LIBRARIES = ("taskflow", "flowengine")

#: Progress values the Progress task reports while it runs.
PROGRESS_STEPS = (0.25, 0.75)

#: Message of the failure the Boom task raises.
BOOM_MESSAGE = "boom: the interop task failed on purpose"


def _add(self: Any, x: int) -> int:
    return x + 1


def _mul(self: Any, y: int) -> int:
    return y * 10


def _double(self: Any, a: int) -> int:
    return a * 2


def _square(self: Any, a: int) -> int:
    return a * a


def _join(self: Any, b: int, c: int) -> list[int]:
    return [b, c, b + c]


def _remember(self: Any, marker_dir: str) -> str:
    _touch(marker_dir, f"{self.name}.executed")
    return f"{self.name} ran"


def _remember_revert(self: Any, marker_dir: str, **kwargs: Any) -> None:
    # The revert runs on a worker, maybe in another process: a file is the
    # evidence the test can see. It records what the engine sent back.
    result = kwargs.get("result")
    _touch(marker_dir, f"{self.name}.reverted", repr(result))


def _boom(self: Any, marker_dir: str) -> None:
    raise RuntimeError(BOOM_MESSAGE)


def _progress(self: Any, x: int) -> int:
    for step in PROGRESS_STEPS:
        self.update_progress(step)
    return x * 3


def _touch(folder: str, name: str, text: str = "") -> None:
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        f.write(text)


_BODIES: dict[str, dict[str, Any]] = {
    "Add": {"execute": _add},
    "Mul": {"execute": _mul},
    "Double": {"execute": _double},
    "Square": {"execute": _square},
    "Join": {"execute": _join},
    "Remember": {"execute": _remember, "revert": _remember_revert},
    "Boom": {"execute": _boom},
    "Progress": {"execute": _progress},
}

TASK_NAMES = tuple(_BODIES)


def build(library: str) -> types.SimpleNamespace:
    """Task classes deriving from ``library``'s Task, named ``<this module>.<Name>``."""
    if library not in LIBRARIES:
        raise ValueError(f"library must be one of {LIBRARIES}, not {library!r}")
    base = importlib.import_module(f"{library}.task").Task
    classes = {}
    for name, methods in _BODIES.items():
        namespace = dict(methods, __module__=__name__, __qualname__=name)
        classes[name] = type(name, (base,), namespace)
    return types.SimpleNamespace(library=library, **classes)


def class_paths() -> list[str]:
    """``module:Class`` strings for every task (what a worker is given)."""
    return [f"{__name__}:{name}" for name in TASK_NAMES]


# --- flows (built from one library's patterns and task classes) ---

FLOW_KINDS = ("linear", "graph", "failing", "progress")


def make_flow(kind: str, tasks: types.SimpleNamespace, marker_dir: str) -> tuple[Any, dict]:
    """The flow of ``kind`` for ``tasks``' library, and its store."""
    lib = tasks.library
    lf = importlib.import_module(f"{lib}.patterns.linear_flow")
    gf = importlib.import_module(f"{lib}.patterns.graph_flow")
    if kind == "linear":
        flow = lf.Flow("linear").add(
            tasks.Add(name="add", provides="y"), tasks.Mul(name="mul", provides="z")
        )
        return flow, {"x": 4}
    if kind == "graph":
        # a -> (double, square) -> join: dependencies inferred from names.
        flow = gf.Flow("graph").add(
            tasks.Join(name="join", provides="joined"),
            tasks.Square(name="square", provides="c"),
            tasks.Double(name="double", provides="b"),
            tasks.Add(name="add", provides="a", rebind={"x": "seed"}),
        )
        return flow, {"seed": 2}
    if kind == "failing":
        flow = lf.Flow("failing").add(
            tasks.Remember(name="first"), tasks.Remember(name="second"), tasks.Boom(name="boom")
        )
        return flow, {"marker_dir": marker_dir}
    if kind == "progress":
        flow = lf.Flow("progress").add(tasks.Progress(name="progress", provides="tripled"))
        return flow, {"x": 5}
    raise ValueError(f"unknown flow kind {kind!r}")


def atom_names(kind: str) -> list[str]:
    """The atoms of a flow kind (for reading their states)."""
    return {
        "linear": ["add", "mul"],
        "graph": ["add", "double", "square", "join"],
        "failing": ["first", "second", "boom"],
        "progress": ["progress"],
    }[kind]


_library = os.environ.get(LIBRARY_ENV, "flowengine")
globals().update({name: cls for name, cls in vars(build(_library)).items() if name != "library"})
