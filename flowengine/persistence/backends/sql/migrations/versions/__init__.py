"""Alembic revisions of the SQL backend, oldest first (``NNNN_what.py``)."""
