"""``compat='taskflow'`` in a board's conf: which layout a Redis or ZooKeeper board uses.

Without it a board keeps flowengine's own layout. With it, the board reads
and writes TaskFlow 6.5's keys/znodes and encoding, so TaskFlow's and
flowengine's conductors share it (see doc/source/migration.rst). The
layouts live in their own modules, imported only when asked for: the
Redis one needs ``msgpack`` (the ``taskflow-compat`` extra).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["COMPAT_VALUES", "TaskflowLayout", "board_layout"]

#: What ``compat`` may say (None or absent: flowengine's own layout).
COMPAT_VALUES = ("taskflow",)


@dataclass(frozen=True)
class TaskflowLayout:
    """TaskFlow's board layout: its defaults, and the stores that speak it."""

    default_namespace: str = "taskflow"
    default_zk_path: str = "/taskflow/jobs"

    def redis_store(self, conf: dict[str, Any]) -> Callable[..., Any]:
        """The store class for a Redis board of ``conf`` (its poll period bound)."""
        from flowengine.jobs.backends import redis_taskflow_layout as layout

        poll_s = float(conf.get("taskflow_poll_s", layout.POLL_S))
        if not poll_s > 0:
            raise ValueError(f"taskflow_poll_s must be above 0, not {poll_s!r}")
        return functools.partial(layout.TaskflowRedisStore, poll_s=poll_s)

    def zk_store(self) -> Callable[..., Any]:
        """The store class for a ZooKeeper board."""
        from flowengine.jobs.backends import zk_taskflow_store as layout

        return layout.TaskflowZkStore


def board_layout(conf: dict[str, Any]) -> TaskflowLayout | None:
    """The layout ``conf['compat']`` asks for (None: flowengine's); ValueError if unknown."""
    value = conf.get("compat")
    if value in (None, ""):
        return None
    if value not in COMPAT_VALUES:
        raise ValueError(
            f"Unknown compat {value!r} for a jobboard; valid: {COMPAT_VALUES}"
            f" (or none for flowengine's own layout)"
        )
    return TaskflowLayout()
