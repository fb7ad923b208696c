"""The sample shop flow the dashboard screenshots show (tools/screenshots.py).

reserve -> charge -> ship, with a parallel 'notify' branch; charge fails for an
odd order number (a card declined), ship waits for HOLD when told to, so a
request is seen running.
"""

from __future__ import annotations

import threading
import time

from flowengine import task
from flowengine.patterns import graph_flow

#: Set to let held 'ship' bodies finish.
HOLD = threading.Event()

#: Seconds each step takes: enough to see requests running.
STEP_S = 0.05


class Reserve(task.Task):
    def execute(self, order_id: int) -> dict[str, int]:
        time.sleep(STEP_S)
        return {"order": order_id, "items": 3}


class Charge(task.Task):
    def execute(self, order_id: int, reservation: dict[str, int]) -> str:
        time.sleep(STEP_S)
        if order_id % 2:
            raise RuntimeError(f"card declined for order {order_id}")
        return f"ch_{order_id:04d}"


class Ship(task.Task):
    def execute(self, order_id: int, charge: str, hold: bool = False) -> str:
        if hold:
            HOLD.wait(120)
        time.sleep(STEP_S)
        return f"parcel for {order_id} ({charge})"


class Notify(task.Task):
    def execute(self, order_id: int, reservation: dict[str, int]) -> str:
        time.sleep(STEP_S)
        return f"mail sent for {order_id}"


def make_shop() -> graph_flow.Flow:
    """The order flow."""
    return graph_flow.Flow("order").add(
        Reserve("reserve", provides="reservation"),
        Charge("charge", provides="charge"),
        Ship("ship", provides="parcel"),
        Notify("notify", provides="mail"),
    )
