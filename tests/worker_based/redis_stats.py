"""What a Redis server counted since it started: for tests that count round trips or connections.

Counters are server-wide: a test that compares two readings needs a server
of its own (``private_redis``) or commands nothing else sends.
"""

from __future__ import annotations

import redis


def command_calls(client: redis.Redis, command: str) -> int:
    """How many times the server ran ``command`` (INFO commandstats)."""
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


def connections_received(client: redis.Redis) -> int:
    """How many connections the server accepted (INFO stats)."""
    return int(client.info("stats")["total_connections_received"])
