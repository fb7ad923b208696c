"""A graph flow: the engine orders tasks from what each requires and provides.

Tasks are added in no particular order; ``graph_flow.Flow`` infers the edges
(``x`` and ``y`` before ``sum``, ``sum`` before ``double``).  The parallel
engine runs independent tasks (``x`` and ``y``) at the same time.
"""

import flowengine.engines
from flowengine import task
from flowengine.patterns import graph_flow as gf


class Double(task.Task):
    """Double a number."""

    def execute(self, total):
        return total * 2


class Adder(task.Task):
    """Add two numbers."""

    def execute(self, a, b):
        return a + b


class Square(task.Task):
    """Square a number."""

    def execute(self, n):
        return n * n


flow = gf.Flow("math").add(
    Double(provides="doubled"),
    Adder(name="sum", provides="total", rebind={"a": "x", "b": "y"}),
    Square(name="x-squared", provides="x", rebind={"n": "a"}),
    Square(name="y-squared", provides="y", rebind={"n": "b"}),
)

result = flowengine.engines.run(flow, engine="parallel", store={"a": 3, "b": 4})
print("x + y =", result["total"])
print("doubled =", result["doubled"])
