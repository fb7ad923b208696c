"""Fixtures of the conductor tests: the jobboard tests' ``boards`` (every board kind)."""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.jobs.conftest import boards  # noqa: E402,F401 (re-exported fixture)
