"""Which of a project's unit-test modules touch TaskFlow (the selection rule).

A test module of ``<package>/tests/unit`` is selected when, read as source
(nothing is imported), it

1. imports ``taskflow`` or one of its modules itself, or
2. names a ``taskflow.`` dotted path in a string (``mock.patch('taskflow...')``), or
3. imports, or names in a string (a ``mock.patch`` target), a module of the
   project outside its tests whose source imports ``taskflow``
   (``from octavia.controller.worker.v2.tasks import cert_task``;
   ``mock.patch('octavia.controller.worker.v2.taskflow_jobboard_driver.X')``).

Only direct imports count, one level deep: a test importing a module that
imports another module that imports TaskFlow is not selected by rule 3 alone
(most of a project's code is a few imports away from its TaskFlow glue, and
those tests exercise the project, not TaskFlow).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

# A string that may be a dotted import path (a mock.patch target).
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")

#: Why a module was selected (printed by the runner, listed in the README).
IMPORTS_TASKFLOW = "imports taskflow"
PATCHES_TASKFLOW = "names a taskflow. path"
IMPORTS_USER = "imports or patches {module}, which imports taskflow"


@dataclass(frozen=True)
class Selected:
    """A selected test module and the first rule that selected it."""

    module: str
    path: Path
    reason: str


def _is_taskflow(name: str) -> bool:
    return name == "taskflow" or name.startswith("taskflow.")


def _imported_names(tree: ast.AST) -> list[str]:
    """Every dotted name an import statement could bind a module from."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            # `from a.b import c`: c may be a module (a.b.c) or a name of a.b.
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _parse(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@functools.cache
def _source_imports_taskflow(path: Path) -> bool:
    return any(_is_taskflow(name) for name in _imported_names(_parse(path)))


def _module_file(site: Path, dotted: str) -> Path | None:
    base = site.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _dotted_strings(tree: ast.AST) -> list[str]:
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _DOTTED.fullmatch(node.value)
    ]


def _prefixes(dotted: str) -> list[str]:
    """``a.b.c`` -> ``a.b.c``, ``a.b``: a patch target is a module, then attributes."""
    parts = dotted.split(".")
    return [".".join(parts[:n]) for n in range(len(parts), 1, -1)]


def _reason(site: Path, package: str, tree: ast.AST) -> str | None:
    imported = _imported_names(tree)
    if any(_is_taskflow(name) for name in imported):
        return IMPORTS_TASKFLOW
    strings = _dotted_strings(tree)
    if any(_is_taskflow(text) for text in strings):
        return PATCHES_TASKFLOW
    for name in imported + [prefix for text in strings for prefix in _prefixes(text)]:
        if not name.startswith(f"{package}.") or name.startswith(f"{package}.tests"):
            continue
        source = _module_file(site, name)
        if source is not None and _source_imports_taskflow(source):
            return IMPORTS_USER.format(module=name)
    return None


def select(site: Path, package: str) -> list[Selected]:
    """The test modules of *package* (installed under *site*) that touch TaskFlow."""
    unit = site / package / "tests" / "unit"
    if not unit.is_dir():
        raise FileNotFoundError(
            f"{package} has no tests/unit under {site}: was it installed"
            " from a wheel that ships its tests?"
        )
    selected = []
    for path in sorted(unit.rglob("test_*.py")):
        reason = _reason(site, package, _parse(path))
        if reason is not None:
            module = ".".join(path.relative_to(site).with_suffix("").parts)
            selected.append(Selected(module, path, reason))
    return selected
