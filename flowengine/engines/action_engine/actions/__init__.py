"""Actions: how the engine moves one kind of atom (task, retry) through its states."""
