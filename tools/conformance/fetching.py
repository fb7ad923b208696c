"""Fetch TaskFlow's wheel into the conformance cache and unpack its tests.

TaskFlow is never a dependency of flowengine: the wheel is downloaded with
pip into a cache directory and only its test files are unpacked from it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

TASKFLOW_VERSION = "6.5.0"
# pip download of one ~200 kB wheel; generous for a slow mirror.
DOWNLOAD_TIMEOUT_S = 300.0
# What the runner unpacks from the wheel: the unit tests and their scaffolding.
_WANTED_PREFIXES = ("taskflow/tests/", "taskflow/test.py")


def cache_dir() -> Path:
    """The runner's cache: $FLOWENGINE_CONFORMANCE_CACHE or ~/.cache/flowengine-conformance."""
    override = os.environ.get("FLOWENGINE_CONFORMANCE_CACHE")
    if override:
        return Path(override).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flowengine-conformance"


def wheel_path(cache: Path) -> Path:
    """Download TaskFlow's wheel into *cache* unless it is already there."""
    wheels = sorted(cache.glob(f"taskflow-{TASKFLOW_VERSION}-*.whl"))
    if wheels:
        return wheels[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"taskflow=={TASKFLOW_VERSION}",
        "-d",
        str(cache),
    ]
    subprocess.run(cmd, check=True, timeout=DOWNLOAD_TIMEOUT_S, stdout=subprocess.DEVNULL)
    wheels = sorted(cache.glob(f"taskflow-{TASKFLOW_VERSION}-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download left no taskflow-{TASKFLOW_VERSION} wheel in {cache}")
    return wheels[0]


def unpacked_tests(cache: Path) -> Path:
    """Return a directory holding the wheel's ``taskflow/test.py`` and ``taskflow/tests``."""
    target = cache / f"taskflow-{TASKFLOW_VERSION}-tests"
    marker = target / ".complete"
    if marker.exists():
        return target
    wheel = wheel_path(cache)
    # Unpack into a private directory, then rename: parallel runners never
    # see a half-written tree.
    staging = cache / f".unpack-{os.getpid()}"
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith(_WANTED_PREFIXES) and member.endswith(".py"):
                archive.extract(member, staging)
    (staging / ".complete").write_text(wheel.name + "\n")
    try:
        staging.rename(target)
    except OSError:
        # Another runner won the race; its tree is identical.
        shutil.rmtree(staging, ignore_errors=True)
    return target
