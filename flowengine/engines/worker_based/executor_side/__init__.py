"""The engine's side: publish requests, follow replies, find workers."""
