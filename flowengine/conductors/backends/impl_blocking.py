"""The blocking conductor: one job at a time, run on the thread that called run()."""

from __future__ import annotations

from typing import Any

import futurist

from flowengine.conductors.backends import impl_executor

__all__ = ["BlockingConductor"]


class BlockingConductor(impl_executor.ExecutorConductor):
    """Claims a job, runs it to its end, finishes it, then looks for the next."""

    #: One job at a time.
    MAX_SIMULTANEOUS_JOBS = 1

    @staticmethod
    def _executor_factory() -> Any:
        return futurist.SynchronousExecutor()

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
