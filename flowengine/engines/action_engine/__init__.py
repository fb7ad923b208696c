"""Local engines: compile a flow and run its atoms in this process."""
