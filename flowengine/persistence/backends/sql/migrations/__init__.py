"""Alembic environment of the SQL backend (run by ``Connection.upgrade()``)."""
