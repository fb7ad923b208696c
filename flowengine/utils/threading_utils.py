"""Thread helpers."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from typing import Any


def get_ident() -> int:
    """Return the identifier of the current thread."""
    return threading.get_ident()


def is_alive(thread: threading.Thread) -> bool:
    """Return whether a thread is alive."""
    return thread.is_alive()


def daemon_thread(target: Callable[..., Any], *args: Any, **kwargs: Any) -> threading.Thread:
    """Return a daemon thread running target(*args, **kwargs); the caller starts it."""
    thread = threading.Thread(target=target, args=args, kwargs=kwargs)
    # Daemonic so a forgotten helper thread never keeps the interpreter alive.
    thread.daemon = True
    return thread


def get_optimal_thread_count(default: int = 2) -> int:
    """Return a sensible number of worker threads for this machine."""
    try:
        return multiprocessing.cpu_count() + 1
    except NotImplementedError:
        return default
