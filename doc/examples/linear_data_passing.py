"""A linear flow whose tasks pass data to each other.

Each task names what it ``provides``; the next one ``requires`` it by argument
name (or via ``rebind``). The engine wires them together and runs them in
order.  Runs unchanged on TaskFlow by replacing ``flowengine`` with ``taskflow``.
"""

import flowengine.engines
from flowengine import task
from flowengine.patterns import linear_flow as lf


class Fetch(task.Task):
    """Produce the raw order lines."""

    default_provides = "lines"

    def execute(self):
        return [("apple", 3, 0.5), ("pear", 2, 0.75), ("fig", 10, 0.2)]


class Total(task.Task):
    """Sum quantity * unit price."""

    def execute(self, lines):
        return sum(qty * price for _name, qty, price in lines)


class AddTax(task.Task):
    """Apply a tax rate that was injected into the store."""

    def execute(self, amount, rate):
        return round(amount * (1 + rate), 2)


flow = lf.Flow("checkout").add(
    Fetch(),
    Total(provides="subtotal"),
    # `rebind` maps AddTax's `amount` argument to the `subtotal` symbol.
    AddTax(provides="total", rebind={"amount": "subtotal"}),
)

engine = flowengine.engines.load(flow, store={"rate": 0.2})
engine.run()
print("subtotal:", engine.storage.fetch("subtotal"))
print("total:", engine.storage.fetch("total"))
