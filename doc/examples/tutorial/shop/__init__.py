"""The tutorial's shop: task classes (tasks.py) and the flow that uses them (flows.py)."""
