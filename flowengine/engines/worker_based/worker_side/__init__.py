"""The worker's side: take requests, run them, answer."""
