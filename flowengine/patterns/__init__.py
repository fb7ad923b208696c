"""Flow patterns: linear, unordered and graph flows."""
