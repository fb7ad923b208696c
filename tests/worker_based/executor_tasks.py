"""Task classes the executor/engine tests run on workers (importable by name)."""

from __future__ import annotations

from typing import Any

from flowengine import task


class Echo(task.Task):
    """Returns its argument."""

    def execute(self, value: Any) -> Any:
        return value


class Other(task.Task):
    """Returns its argument doubled (served only by some workers in the tests)."""

    def execute(self, value: Any) -> Any:
        return value * 2


class Progress(task.Task):
    """Reports progress 0.5 then returns 'done'."""

    def execute(self) -> str:
        self.update_progress(0.5)
        return "done"


class Fail(task.Task):
    """Always raises RuntimeError('Woot!')."""

    def execute(self, **kwargs: Any) -> None:
        raise RuntimeError("Woot!")


class RevertRecorder(task.Task):
    """Returns 1; its revert describes the result and failures it was given."""

    def execute(self) -> int:
        return 1

    def revert(self, result: Any = None, flow_failures: Any = None, **kwargs: Any) -> dict:
        described = {name: f.exception_str for name, f in (flow_failures or {}).items()}
        if hasattr(result, "exception_str"):
            result = ["failure", result.exception_str]
        return {"result": result, "failures": described}


class Announcing(task.Task):
    """Notifies a custom event it declares (TASK_EVENTS) from its body, as TaskFlow allows."""

    TASK_EVENTS = (*task.Task.TASK_EVENTS, "stage-reached")

    def execute(self) -> str:
        self.notifier.notify("stage-reached", {"stage": "halfway"})
        return "done"


class Sleeps(task.Task):
    """Sleeps ``seconds`` (the body's known duration), returns them."""

    def execute(self, seconds: float) -> float:
        import time

        time.sleep(seconds)
        return seconds
