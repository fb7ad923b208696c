"""The workers that answered the last ``inspect``/``control`` broadcast, remembered.

A broadcast cannot know how many workers will answer, so it used to wait its
whole ``--timeout``. Each run now writes who answered to a small file in the
user's cache (per broker and exchange); the next run returns as soon as
those workers answered (plus a short grace for newcomers). A worker that has
gone costs one full wait, after which it is forgotten.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

#: Environment variable naming the cache directory (else $XDG_CACHE_HOME or ~/.cache).
CACHE_ENV = "FLOWENGINE_CACHE_DIR"


def _path(broker_uri: str, exchange: str) -> Path:
    base = os.environ.get(CACHE_ENV)
    root = (
        Path(base)
        if base
        else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flowengine"
    )
    key = hashlib.sha256(f"{broker_uri}\0{exchange}".encode()).hexdigest()[:24]
    return root / "known-workers" / f"{key}.json"


def load(broker_uri: str, exchange: str) -> frozenset[str]:
    """Who answered last time (empty when unknown or unreadable: then wait it out)."""
    try:
        ids = json.loads(_path(broker_uri, exchange).read_text())
    except (OSError, ValueError):
        return frozenset()
    return frozenset(i for i in ids if isinstance(i, str)) if isinstance(ids, list) else frozenset()


def save(broker_uri: str, exchange: str, worker_ids: Iterable[str]) -> None:
    """Remember ``worker_ids``; a cache that cannot be written only costs speed."""
    path = _path(broker_uri, exchange)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(sorted(set(worker_ids))))
        temporary.replace(path)
    except OSError:
        pass
