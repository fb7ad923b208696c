"""A flaky task inside a subflow controlled by a ``Times`` retry.

The first two attempts fail; the retry controller reverts the subflow and runs
it again, up to ``attempts`` times, and the third attempt succeeds.
"""

import flowengine.engines
from flowengine import retry, task
from flowengine.patterns import linear_flow as lf

ATTEMPTS = {"count": 0}


class Flaky(task.Task):
    """Fail until the third call."""

    def execute(self):
        ATTEMPTS["count"] += 1
        if ATTEMPTS["count"] < 3:
            raise OSError(f"transient error on attempt {ATTEMPTS['count']}")
        return "connected"

    def revert(self, *args, **kwargs):
        print(f"reverting flaky attempt {ATTEMPTS['count']}")


class Report(task.Task):
    """Use the flaky task's result."""

    def execute(self, status):
        return f"status={status}"


flow = lf.Flow("main").add(
    lf.Flow("connect", retry=retry.Times(attempts=5, name="retry-connect")).add(
        Flaky(provides="status"),
    ),
    Report(provides="report"),
)

result = flowengine.engines.run(flow)
print("attempts:", ATTEMPTS["count"])
print("report:", result["report"])
