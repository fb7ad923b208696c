"""TaskFlow's module path for the server; the code is in :mod:`.worker_side.server`."""

from flowengine.engines.worker_based.worker_side.server import Server

__all__ = ["Server"]
