"""Persistence: models (logbooks, flow and atom details) and backends."""
