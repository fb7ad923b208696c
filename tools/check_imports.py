#!/usr/bin/env python3
"""Import every module of flowengine; fail unless each imports or names its extra.

Run by CI in a fresh virtualenv holding flowengine without extras: a module
whose optional dependency is missing must fail with
:class:`flowengine.exceptions.MissingExtra` (whose message names the
``pip install 'flowengine[...]'`` to run), never with a bare
``ModuleNotFoundError``. Alembic's migration scripts are skipped: alembic
loads them itself, inside a migration run.

    python tools/check_imports.py [--require-all]

``--require-all``: every module must import (an environment with every extra).
Prints one line per module that needs an extra, then a summary; exits 1 on
any other failure.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import traceback

#: Packages run by a tool of their own, not importable on their own.
SKIPPED_PACKAGES = ("flowengine.persistence.backends.sql.migrations",)


def module_names(package: str = "flowengine") -> list[str]:
    """Every module below ``package`` (itself included), sorted, minus the skipped ones."""
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=package + "."):
        if not info.name.startswith(SKIPPED_PACKAGES):
            names.append(info.name)
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--require-all",
        action="store_true",
        help="fail when any module needs an extra that is missing",
    )
    args = parser.parse_args(argv)

    from flowengine import exceptions as exc

    imported, needs_extra, broken = 0, [], []
    for name in module_names():
        try:
            importlib.import_module(name)
        except exc.MissingExtra as e:
            needs_extra.append(name)
            print(f"{name}: {e}")
        except Exception:
            broken.append(name)
            print(f"{name}: FAILED\n{traceback.format_exc()}", file=sys.stderr)
        else:
            imported += 1
    print(
        f"check_imports: {imported} imported, {len(needs_extra)} need an extra,"
        f" {len(broken)} failed"
    )
    if broken or (args.require_all and needs_extra):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
