"""Talking to a broker: the proxy (publish, consume) and the dispatcher."""
