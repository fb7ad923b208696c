"""A sample workflow for ``flowengine demo`` (tasks importable by remote workers)."""
