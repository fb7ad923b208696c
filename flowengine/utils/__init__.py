"""Small helpers shared across flowengine (reflection, misc, threading)."""
