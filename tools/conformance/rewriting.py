"""Build the per-run work tree: TaskFlow's unit tests, imports rewritten.

TaskFlow's scaffolding (``taskflow/test.py``, ``taskflow/tests/utils.py``,
``taskflow/tests/fixtures.py``) moves into a local package, ``tfconformance``,
so the tests keep their helpers whichever engine they run against.  In
``flowengine`` mode every other ``taskflow`` import becomes ``flowengine``; in
``taskflow`` mode (the baseline) only the scaffolding moves, so both runs
produce the same test ids.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

SCAFFOLD_PACKAGE = "tfconformance"
HERE = Path(__file__).resolve().parent

# Scaffolding first: these keep TaskFlow's test helpers local to the run.
_SCAFFOLD_RULES = (
    (re.compile(r"\btaskflow\.tests\b"), f"{SCAFFOLD_PACKAGE}.tests"),
    (re.compile(r"\btaskflow\.test\b"), f"{SCAFFOLD_PACKAGE}.test"),
    (re.compile(r"\bfrom taskflow import test\b"), f"from {SCAFFOLD_PACKAGE} import test"),
    # TaskFlow's own eventlet probe lives in its utils; the run answers it
    # itself (honestly: is eventlet importable here?).
    (
        re.compile(r"\bfrom taskflow\.utils import eventlet_utils\b"),
        f"from {SCAFFOLD_PACKAGE} import probes",
    ),
)
_ENGINE_RULE = re.compile(r"\btaskflow\b")

# utils.py imports the ZooKeeper/etcd/Redis clients only for its availability
# probes; the run replaces the probes (tfconformance/probes.py), so these
# imports go and the optional clients need not be installed.
_PROBE_IMPORTS = re.compile(
    r"^(import etcd3gw|import redis|from taskflow\.utils import (kazoo_utils|redis_utils))\n",
    re.MULTILINE,
)
_PROBE_OVERRIDE = (
    "\n\n# Added by flowengine's conformance runner: honest environment probes.\n"
    f"from {SCAFFOLD_PACKAGE}.probes import (  # noqa: E402,F401\n"
    "    etcd_available,\n    redis_available,\n    zookeeper_available,\n)\n"
)


def rewrite_source(text: str, target: str) -> str:
    """Rewrite one TaskFlow test file for *target* (``flowengine`` or ``taskflow``)."""
    for pattern, replacement in _SCAFFOLD_RULES:
        text = pattern.sub(replacement, text)
    if target == "flowengine":
        text = _ENGINE_RULE.sub("flowengine", text)
    return guard_engine_imports(text, target)


def guard_engine_imports(text: str, package: str) -> str:
    """Let a module import even when one of *package*'s modules is missing.

    Each top-level ``import``/``from`` of *package* that raises ImportError
    binds a placeholder instead (``tfconformance.probes.Missing``), so only the
    tests that use the missing module fail, with the ImportError as cause.
    """
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    for node in reversed(tree.body):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [alias.asname or alias.name for alias in node.names]
        else:
            module = node.names[0].name
            names = [alias.asname or alias.name.split(".")[0] for alias in node.names]
        if module.split(".")[0] != package or "*" in names:
            continue
        original = "".join(lines[node.lineno - 1 : node.end_lineno])
        body = "".join("    " + line for line in original.splitlines(keepends=True))
        fallback = "".join(
            f"    {name} = _tfconformance_missing({name!r}, _import_error)\n" for name in names
        )
        lines[node.lineno - 1 : node.end_lineno] = [
            f"try:\n{body}except ImportError as _import_error:\n{fallback}"
        ]
    header = f"from {SCAFFOLD_PACKAGE}.probes import missing as _tfconformance_missing\n"
    return _after_docstring_and_future(tree, lines, header)


def _after_docstring_and_future(tree: ast.Module, lines: list[str], header: str) -> str:
    # The helper import must follow the docstring and any __future__ import.
    insert_at = 0
    for node in tree.body:
        is_doc = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if not (is_doc or is_future):
            break
        insert_at = node.end_lineno
    # Line numbers refer to the original lines; edits above only replaced
    # later statements one-for-one, so the prefix is unchanged.
    return "".join(lines[:insert_at]) + header + "".join(lines[insert_at:])


def build_work_tree(unpacked: Path, work: Path, target: str) -> Path:
    """Write the rewritten tests under *work*; return the unit-test directory."""
    if target not in ("flowengine", "taskflow"):
        raise ValueError(f"unknown conformance target {target!r}: flowengine or taskflow")
    source_root = unpacked / "taskflow"
    package = work / SCAFFOLD_PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""TaskFlow test scaffolding, local to this run."""\n')
    shutil.copyfile(HERE / "probes.py", package / "probes.py")
    for source in sorted(source_root.rglob("*.py")):
        relative = source.relative_to(source_root)
        if (
            relative.parts[0] == "tests"
            and len(relative.parts) == 2
            and relative.name
            not in (
                "__init__.py",
                "utils.py",
                "fixtures.py",
            )
        ):
            continue  # tests/test_examples.py runs TaskFlow's examples: not unit tests
        text = source.read_text()
        if relative == Path("tests/utils.py"):
            text = _PROBE_IMPORTS.sub("", text) + _PROBE_OVERRIDE
        destination = package / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(rewrite_source(text, target))
    shutil.copyfile(HERE / "workdir_conftest.py", work / "conftest.py")
    (work / "pytest.ini").write_text(
        "[pytest]\n# Written by tools/conformance: keeps the project's pytest settings out.\n"
        "python_files = test_*.py\n"
        "# Only unittest classes are tests (as under stestr): never module functions\n"
        "# such as test_conductors.test_factory.\n"
        "python_functions = conformance_collects_no_plain_functions\n"
    )
    return package / "tests" / "unit"
