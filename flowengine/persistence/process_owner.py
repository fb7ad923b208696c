"""Which process runs a flow, and whether that process is still alive.

``flowengine run`` (and ``flows resume``/``retry``) record their process in
the flow detail; ``flows resume`` refuses to take over a flow whose
process is still alive on this host. A pid alone can be reused after the
process dies, so on Linux the process's start time (and the boot it
belongs to) is recorded too and must match.
"""

from __future__ import annotations

import os
import socket
from typing import Any

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def _boot_id() -> str | None:
    try:
        with open(_BOOT_ID_PATH, encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    return text[text.rfind(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    # starttime is field 22 of stat(5); fields here start at field 3 (state).
    if fields is None or len(fields) < 20:
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


#: (pid, this_process() of that pid): read once per process (a forked child
#: has another pid), since every run records it (two files of /proc read).
_recorded: tuple[int, dict[str, Any]] | None = None


def this_process() -> dict[str, Any]:
    """How this process is recorded as a flow's owner (JSON)."""
    global _recorded
    pid = os.getpid()
    if _recorded is None or _recorded[0] != pid:
        _recorded = (
            pid,
            {
                "host": socket.gethostname(),
                "pid": pid,
                "boot_id": _boot_id(),
                "start_ticks": _start_ticks(pid),
            },
        )
    return dict(_recorded[1])


def is_alive(owner: dict[str, Any]) -> bool | None:
    """Whether ``owner`` still runs: True, False, or None when this host cannot tell."""
    if owner.get("host") != socket.gethostname():
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    boot_id = owner.get("boot_id")
    if boot_id and _boot_id() and boot_id != _boot_id():
        return False  # recorded before a reboot
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    fields = _stat_fields(pid)
    if fields is not None and fields[0] in ("Z", "X"):
        return False  # a zombie: dead, not yet reaped by its parent
    recorded = owner.get("start_ticks")
    current = _start_ticks(pid)
    if recorded is not None and current is not None and recorded != current:
        return False  # the pid now belongs to another process
    return True


def describe(owner: dict[str, Any]) -> str:
    """``pid 123 on host web-1`` (or what is known of it)."""
    return f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}"
