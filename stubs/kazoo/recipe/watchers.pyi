from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient

class ChildrenWatch:
    def __init__(self, client: KazooClient, path: str,
                 func: Callable[..., Any] | None = ..., allow_session_lost: bool = ...,
                 send_event: bool = ...) -> None: ...

class DataWatch:
    def __init__(self, client: KazooClient, path: str,
                 func: Callable[..., Any] | None = ..., *args: Any, **kwargs: Any) -> None: ...
