"""Make ``import taskflow.X`` return the module ``flowengine.X`` itself.

Copied into the real-users work tree and loaded by pytest as a plugin
(``-p taskflow_alias``) before any test module is imported, in the flowengine
run only.  A finder placed first on ``sys.meta_path`` answers every
``taskflow`` name: the module it hands back is the very ``flowengine`` module
object (``taskflow.engines is flowengine.engines``), so patching
``taskflow.engines.load`` patches what flowengine's code calls, as it would
for a program whose imports were renamed.  The installed TaskFlow stays on
disk (the baseline run needs it) but can no longer be imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

ALIAS = "taskflow"
TARGET = "flowengine"


class _ExistingModuleLoader(importlib.abc.Loader):
    """Hands the import system an already imported flowengine module."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system set __spec__ to the alias's spec on the way in;
        # the module keeps its own (pickling, reload and relative imports read it).
        module.__spec__ = self._spec


class TaskflowAliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``taskflow`` and ``taskflow.*`` as the same-named flowengine modules."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real_name = TARGET + fullname[len(ALIAS) :]
        # An ImportError here is the caller's: flowengine lacks that module.
        module = importlib.import_module(real_name)
        is_package = hasattr(module, "__path__")
        return importlib.machinery.ModuleSpec(
            fullname, _ExistingModuleLoader(module), is_package=is_package
        )


def install() -> None:
    """Put the finder first, once; refuse if real TaskFlow was already imported."""
    if any(isinstance(finder, TaskflowAliasFinder) for finder in sys.meta_path):
        return
    already = sorted(name for name in sys.modules if name.split(".")[0] == ALIAS)
    if already:
        raise RuntimeError(f"TaskFlow was imported before the alias: {already[:5]}")
    sys.meta_path.insert(0, TaskflowAliasFinder())


install()
