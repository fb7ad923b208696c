"""When a task fails, the engine reverts what already ran, newest first.

``Book`` and ``Charge`` succeed, ``Ship`` fails; their ``revert`` methods run in
reverse order and ``run()`` re-raises the original exception.
"""

import flowengine.engines
from flowengine import task
from flowengine.patterns import linear_flow as lf

JOURNAL = []


class Book(task.Task):
    """Reserve a seat."""

    def execute(self):
        JOURNAL.append("booked")
        return "seat-12A"

    def revert(self, result, **kwargs):
        JOURNAL.append(f"released {result}")


class Charge(task.Task):
    """Charge the card."""

    def execute(self, seat):
        JOURNAL.append(f"charged for {seat}")
        return 120

    def revert(self, result, **kwargs):
        JOURNAL.append(f"refunded {result}")


class Ship(task.Task):
    """Fails: the printer is out of paper."""

    def execute(self):
        raise RuntimeError("printer out of paper")


flow = lf.Flow("order").add(Book(provides="seat"), Charge(provides="paid"), Ship())

try:
    flowengine.engines.run(flow)
except RuntimeError as exc:
    print("flow failed:", exc)
for line in JOURNAL:
    print(line)
