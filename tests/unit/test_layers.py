"""Layering: ``flowengine.utils`` imports nothing above it.

utils is the bottom layer (with ``flowengine.exceptions``): persistence,
engines and the rest build on it, so an import the other way round is a cycle
waiting to happen and puts code in the wrong place.
"""

from __future__ import annotations

import ast
import pathlib

import flowengine
from flowengine.persistence import helpers
from flowengine.utils import persistence_utils

UTILS_DIR = pathlib.Path(flowengine.__file__).parent / "utils"

#: What a utils module may import from flowengine (``__version__`` is the
#: package's own constant, defined in flowengine/__init__.py).
ALLOWED_PREFIXES = ("flowengine.utils", "flowengine.exceptions", "flowengine.__version__")

#: TaskFlow's public module path, kept as a re-export of the persistence layer.
REEXPORTS = {"persistence_utils.py"}


def _flowengine_imports(source: str) -> set[str]:
    """Every flowengine module a source imports, at top level or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("flowengine"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flowengine"):
            module = node.module or ""
            if module == "flowengine":
                # "from flowengine import states" imports flowengine.states
                found.update(f"flowengine.{a.name}" for a in node.names)
            else:
                found.add(module)
    return found


def test_utils_modules_import_only_utils_and_exceptions():
    # Given every module of flowengine/utils but TaskFlow's re-export path
    modules = sorted(p for p in UTILS_DIR.glob("*.py") if p.name not in REEXPORTS)
    assert modules
    # When their flowengine imports are collected
    upward = {
        p.name: sorted(
            m
            for m in _flowengine_imports(p.read_text(encoding="utf-8"))
            if not m.startswith(ALLOWED_PREFIXES)
        )
        for p in modules
    }
    # Then none reaches above the utils layer
    assert {name: found for name, found in upward.items() if found} == {}


def test_taskflow_persistence_utils_path_reexports_the_persistence_helpers():
    for name in persistence_utils.__all__:
        assert getattr(persistence_utils, name) is getattr(helpers, name)
