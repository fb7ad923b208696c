"""Board events between the processes of one host, for the SQLite jobboard.

SQLite has no notifications, so each listening board binds a Unix datagram
socket in a directory of its own database (under the system's temporary
directory, named after a hash of the database path: socket paths are
limited to about 100 bytes); whoever changes the board sends one datagram
to every socket there. A listener blocks in ``recv``: nobody polls. Sockets
left by killed processes refuse datagrams and are removed by the next
sender. The last listener to shut removes the directory too (one per
database would otherwise pile up in the temporary directory); a listener
that binds just as it goes makes the directory again.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import socket
import tempfile
import uuid as uuid_mod

__all__ = ["SEND_TIMEOUT_S", "directory_for", "listen", "receive", "send", "shut"]

#: Bound on handing one datagram to one listener (its buffer may be full if
#: it is paused): a stuck listener must not hold up the writer.
SEND_TIMEOUT_S = 0.2
#: How long one receive blocks before looking again whether it should stop
#: (closing the socket wakes it sooner).
RECEIVE_BLOCK_S = 5.0
#: Attempts at binding in a directory the last listener may be removing.
BIND_ATTEMPTS = 5


def directory_for(database: str, namespace: str) -> str:
    """The directory where the listeners of ``namespace`` on ``database`` bind."""
    digest = hashlib.sha256(f"{os.path.abspath(database)}\0{namespace}".encode()).hexdigest()
    return os.path.join(tempfile.gettempdir(), f"flowengine-jobs-{digest[:16]}")


def listen(directory: str) -> socket.socket:
    """A datagram socket bound in ``directory`` (created if missing)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = os.path.join(directory, f"{uuid_mod.uuid4().hex[:16]}.sock")
    for attempt in range(BIND_ATTEMPTS):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        try:
            sock.bind(path)
            break
        except FileNotFoundError:
            # The last listener removed the directory between the two calls.
            if attempt == BIND_ATTEMPTS - 1:
                sock.close()
                raise
    sock.settimeout(RECEIVE_BLOCK_S)
    return sock


def receive(sock: socket.socket) -> list[bytes]:
    """The next datagram (blocking), or none after RECEIVE_BLOCK_S."""
    try:
        return [sock.recv(4096)]
    except TimeoutError:
        return []


def shut(sock: socket.socket) -> None:
    """Wake its receiver, close the socket, remove its file (and the directory, if now empty)."""
    path = sock.getsockname()
    # Closing does not interrupt a recv() blocked in another thread: an empty
    # datagram to itself does (the receiver then sees it was stopped).
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
        out.settimeout(SEND_TIMEOUT_S)
        out.sendto(b"", path)
    sock.close()
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):  # another listener's socket is still there
        os.rmdir(os.path.dirname(path))


def send(directory: str, payload: bytes) -> None:
    """Send ``payload`` to every listener in ``directory``; drop dead ones' sockets."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
        out.settimeout(SEND_TIMEOUT_S)
        for path in glob.glob(os.path.join(directory, "*.sock")):
            try:
                out.sendto(payload, path)
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # its process is gone
            except OSError:
                pass  # busy or paused listener: it re-reads the board when it wakes
