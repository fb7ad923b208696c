"""The shop's order flow: reserve, charge, confirm."""

from flowengine.patterns import linear_flow
from shop import tasks


def make_order():
    """A new order flow; `flowengine run shop.flows:make_order` calls this."""
    return linear_flow.Flow("order").add(
        tasks.ReserveSeat(), tasks.ChargeCard(), tasks.SendConfirmation()
    )
