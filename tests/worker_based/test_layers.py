"""Layering of worker_based: imports point one way (doc/source/architecture.rst).

wire/ depends on nothing of the package; transports/ on wire/; messaging/
on both; events/ on messaging/ (and below); each side on all of these and
never on the other side.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from flowengine.engines.worker_based import protocol

PACKAGE = "flowengine.engines.worker_based"
ROOT = pathlib.Path(protocol.__file__).parent

#: Subpackage -> the subpackages its modules may import (besides themselves).
#: ``protocol`` is TaskFlow's path for the wire's names: it counts as wire.
MAY_IMPORT = {
    "wire": set(),
    "transports": {"wire"},
    "messaging": {"wire", "transports"},
    "events": {"wire", "transports", "messaging"},
    "executor_side": {"wire", "transports", "messaging", "events"},
    "worker_side": {"wire", "transports", "messaging", "events"},
}


def _layer(module: str) -> str | None:
    """The subpackage a worker_based module belongs to (None: a top-level module)."""
    rest = module[len(PACKAGE) + 1 :].split(".")
    if rest[0] == "protocol":
        return "wire"
    return rest[0] if rest[0] in MAY_IMPORT else None


def _imports(path: pathlib.Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
            if node.module == PACKAGE:
                found.update(f"{PACKAGE}.{alias.name}" for alias in node.names)
            else:
                found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE + "."))
    return found


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_imports_point_one_way(layer):
    wrong = []
    for path in sorted((ROOT / layer).glob("*.py")):
        for module in _imports(path):
            target = _layer(module)
            if target is not None and target != layer and target not in MAY_IMPORT[layer]:
                wrong.append(f"{path.name} imports {module}")
    assert wrong == []


def test_wire_does_not_import_protocol():
    # ``protocol`` counts as wire for the layers above, but it is TaskFlow's
    # path re-exporting the wire's names: wire importing it would be a cycle.
    wrong = [
        f"{path.name} imports {module}"
        for path in sorted((ROOT / "wire").glob("*.py"))
        for module in _imports(path)
        if not module.startswith(f"{PACKAGE}.wire")
    ]
    assert wrong == []


def test_every_subpackage_is_placed():
    found = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert found == set(MAY_IMPORT)
