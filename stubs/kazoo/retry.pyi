# The part of kazoo.retry that flowengine uses.
from collections.abc import Callable
from typing import Any

class KazooRetry:
    max_tries: int | None
    max_delay: float
    def __init__(
        self,
        max_tries: int | None = ...,
        delay: float = ...,
        backoff: float = ...,
        max_jitter: float = ...,
        max_delay: float = ...,
        ignore_expire: bool = ...,
        sleep_func: Callable[[float], Any] = ...,
        deadline: float | None = ...,
        interrupt: Callable[[], bool] | None = ...,
    ) -> None: ...
