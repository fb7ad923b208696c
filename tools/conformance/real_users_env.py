"""The cached virtualenv of the real-users run: Octavia, Masakari, TaskFlow.

Octavia and Masakari are installed from PyPI with their tests (their wheels
ship ``<package>/tests``), with TaskFlow 6.5.0 for the baseline and
flowengine's own requirements; flowengine itself is never installed there,
the run puts the source tree under test on ``sys.path``.  Every package is
pinned by ``real-users-constraints.txt`` so a cold run builds the venv the
baseline files were measured in.  The venv's directory name is a hash of
what goes into it: changing a pin, flowengine's requirements or the Python
version builds a new one, and a finished venv is reused as it is.
"""

from __future__ import annotations

import configparser
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fetching

HERE = Path(__file__).resolve().parent
CONSTRAINTS = HERE / "real-users-constraints.txt"
#: The projects whose TaskFlow-touching unit tests run, and their releases.
PROJECTS = {"octavia": "19.0.0", "masakari": "22.0.0"}
#: What their unit tests need besides the projects (from each project's
#: test-requirements.txt: only what the selected tests import, plus the runner's
#: pytest). pyroute2: Octavia's requirements.txt lists it (behind a platform
#: marker its wheel's metadata drops); the amphora driver tests import it.
TEST_PACKAGES = (
    "pytest",
    "pytest-timeout",
    "fixtures",
    "oslotest",
    "testtools",
    "testresources",
    "testscenarios",
    "requests-mock",
    "WebTest",
    "ddt",
    "kazoo",
    "pyroute2",
)
#: flowengine extras whose modules the projects' TaskFlow code reaches
#: (Octavia's persistence driver: SQL; its jobboard driver: ZooKeeper).
FLOWENGINE_EXTRAS = ("sql", "zookeeper")
#: pip installing ~150 packages on a cold cache takes 1.5-2 minutes here.
INSTALL_TIMEOUT_S = 900
_COMPLETE = ".complete"


def flowengine_requirements(source: Path) -> list[str]:
    """flowengine's install requirements and FLOWENGINE_EXTRAS, read from setup.cfg."""
    parser = configparser.ConfigParser()
    parser.read(source / "setup.cfg")
    lines = parser.get("options", "install_requires").splitlines()
    for extra in FLOWENGINE_EXTRAS:
        lines += parser.get("options.extras_require", extra).splitlines()
    return sorted(
        {line.strip() for line in lines if line.strip() and not line.strip().startswith("#")}
    )


def requirements(source: Path) -> list[str]:
    """Everything the venv gets (before constraints)."""
    pinned = [f"{name}=={version}" for name, version in PROJECTS.items()]
    pinned.append(f"taskflow=={fetching.TASKFLOW_VERSION}")
    return pinned + list(TEST_PACKAGES) + flowengine_requirements(source)


def venv_key(source: Path) -> str:
    """A hash of the venv's contents-to-be: Python version, requirements, pins."""
    digest = hashlib.sha256()
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}\n".encode())
    digest.update("\n".join(requirements(source)).encode())
    digest.update(CONSTRAINTS.read_bytes())
    return digest.hexdigest()[:12]


def venv_python(venv: Path) -> Path:
    """The venv's interpreter."""
    return venv / "bin" / "python"


def site_packages(python: Path) -> Path:
    """Where the venv installed the projects (their tests are read from there)."""
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def ensure_venv(cache: Path, source: Path) -> tuple[Path, bool]:
    """The venv's interpreter, and whether it had to be built now."""
    venv = cache / f"real-users-venv-{venv_key(source)}"
    if (venv / _COMPLETE).exists():
        return venv_python(venv), False
    # Built aside and renamed when complete: a parallel run, or one killed
    # half-way, never leaves a half-installed venv under the final name.
    staging = cache / f".{venv.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True)
    cmd = [
        str(venv_python(staging)),
        "-m",
        "pip",
        "install",
        "-q",
        "-c",
        str(CONSTRAINTS),
        *requirements(source),
    ]
    print(
        f"building {venv.name} (pip install of {len(requirements(source))}"
        " requirements, pinned by real-users-constraints.txt)",
        flush=True,
    )
    subprocess.run(cmd, check=True, timeout=INSTALL_TIMEOUT_S)
    (staging / _COMPLETE).write_text("\n".join(requirements(source)) + "\n")
    try:
        staging.rename(venv)
    except OSError:
        # Another run finished the same venv first; it is identical.
        shutil.rmtree(staging, ignore_errors=True)
    return venv_python(venv), True
