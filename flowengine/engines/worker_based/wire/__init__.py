"""The wire protocol: names, schemas, messages, failures, the request machine."""
