"""The nonblocking conductor: up to N jobs at once, each on a thread of a pool."""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from typing import Any

from flowengine.conductors.backends import impl_executor
from flowengine.utils import threading_utils as tu

__all__ = ["NonBlockingConductor"]


class NonBlockingConductor(impl_executor.ExecutorConductor):
    """Runs several jobs at once on an executor.

    ``executor_factory`` (optional) is called with this conductor at run()
    time and must return an executor to submit jobs to; by default a thread
    pool as large as ``max_simultaneous_jobs``. ValueError if not callable.
    """

    #: Jobs at once by default: as many as threads that suit this machine.
    MAX_SIMULTANEOUS_JOBS = tu.get_optimal_thread_count()

    def _default_executor_factory(self) -> Any:
        workers = self._max_simultaneous_jobs
        if workers <= 0:
            workers = tu.get_optimal_thread_count()
        # The standard library's pool: its shutdown returns as soon as the
        # jobs did, where futurist's waits out its workers' 1 s poll.
        return futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="flowengine-conductor"
        )

    def __init__(
        self,
        name: str,
        jobboard: Any,
        persistence: Any = None,
        engine: Any = None,
        engine_options: dict[str, Any] | None = None,
        wait_timeout: Any = None,
        log: Any = None,
        max_simultaneous_jobs: int = MAX_SIMULTANEOUS_JOBS,
        executor_factory: Callable[..., Any] | None = None,
        allow_job_engine_options: bool = True,
    ) -> None:
        super().__init__(
            name,
            jobboard,
            persistence=persistence,
            engine=engine,
            engine_options=engine_options,
            wait_timeout=wait_timeout,
            log=log,
            max_simultaneous_jobs=max_simultaneous_jobs,
            allow_job_engine_options=allow_job_engine_options,
        )
        if executor_factory is None:
            self._executor_factory = self._default_executor_factory  # type: ignore[method-assign]
        elif not callable(executor_factory):
            raise ValueError("Provided keyword argument 'executor_factory' must be callable")
        else:
            self._executor_factory = executor_factory  # type: ignore[method-assign]
