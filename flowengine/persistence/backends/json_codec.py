"""JSON encoding of stored records, with errors that name the record.

Backends that keep data outside the process (directory, SQL) store every
record as JSON. A value that cannot be encoded raises SerializationFailure
*before* anything is written, naming the record and the field, so the
stored record stays valid; text that cannot be decoded raises InvalidFormat
naming where it was read from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flowengine import exceptions as exc

__all__ = ["decode", "describe", "encode", "encode_field"]

# Encoding errors the json module raises: unsupported types (TypeError),
# circular references and out-of-range floats (ValueError), recursion depth.
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)


def describe(data: Mapping[str, Any], kind: str) -> str:
    """Human name of a record: ``AtomDetail 'name' (uuid ...)``."""
    name = data.get("name")
    uuid = data.get("uuid")
    if name is None:
        return f"{kind} {uuid!r}"
    return f"{kind} {name!r} (uuid {uuid})"


def encode_field(value: Any, what: str, field: str) -> str:
    """Encode one field of a record; SerializationFailure names ``what`` and ``field``."""
    try:
        return json.dumps(value, separators=(",", ":"))
    except _ENCODE_ERRORS as e:
        raise exc.SerializationFailure(
            f"Cannot store {what}: field {field!r} is not JSON serialisable ({e});"
            " results, failures and metadata kept by this backend must be JSON"
            " (dict, list, str, int, float, bool, None)",
            cause=e,
        ) from e


def encode(data: Mapping[str, Any], what: str) -> str:
    """Encode a whole record; on failure find and name the offending field."""
    try:
        return json.dumps(data, separators=(",", ":"))
    except _ENCODE_ERRORS as e:
        # Slow path only on error: encode field by field to name the culprit.
        for key, value in data.items():
            encode_field(value, what, key)
        raise exc.SerializationFailure(f"Cannot store {what} as JSON: {e}", cause=e) from e


def decode(text: str | bytes, where: str) -> Any:
    """Decode JSON read from ``where``; InvalidFormat names it and the error."""
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise exc.InvalidFormat(f"Stored data at {where} is not valid JSON: {e}", cause=e) from e
