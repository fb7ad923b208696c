import socket
from typing import Any

_UNAVAIL: set[int]

class _AbstractTransport:
    connected: bool
    sock: socket.socket
    def __init__(self, host: str, connect_timeout: float | None = ...,
                 read_timeout: float | None = ..., write_timeout: float | None = ...,
                 socket_settings: Any = ..., raise_on_initial_eintr: bool = ...,
                 **kwargs: Any) -> None: ...
    def _setup_transport(self) -> None: ...
    def having_timeout(self, timeout: float | None) -> Any: ...
    def read_frame(self, unpack: Any = ...) -> tuple[int, int, bytes]: ...

class TCPTransport(_AbstractTransport): ...
