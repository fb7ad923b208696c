"""SQL schema (tables) and alembic migrations of the SQLAlchemy backend."""
