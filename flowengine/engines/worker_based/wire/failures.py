"""Failures on the wire: turning them into JSON dicts and checking received ones.

A failure travels as a dict inside a response (a task's error) or a revert
request (the execute result, the flow's failures). Both directions live
here so what is sent and what is accepted stay the same format.
"""

from __future__ import annotations

import json
from typing import Any

from flowengine import exceptions as exc
from flowengine.types import failure as ft


def failure_to_dict(failure: ft.Failure) -> dict[str, Any]:
    """Convert a failure into a JSON-serialisable dict (dropping args that are not)."""
    data = failure.to_dict()
    try:
        _json_check(data)
    except (TypeError, ValueError):
        return failure.to_dict(include_args=False)
    return data


def _json_check(value: Any) -> None:
    """Raise TypeError/ValueError if ``value`` cannot be encoded as JSON."""
    json.dumps(value, allow_nan=False)


def validate_failure(data: Any, where: str) -> None:
    """Validate one nested failure dict (fields, causes, version); say where it was.

    Raises InvalidFormat naming ``where`` and the first problem found.
    """
    try:
        ft.Failure.validate(data)
    except exc.InvalidFormat as e:
        raise exc.InvalidFormat(f"{where}: {e.args[0] if e.args else e}")
    # The schema leaves 'version' optional, but from_dict only reads the
    # version it knows: check it here, before anything acts on the message.
    pending = [data]
    while pending:
        item = pending.pop()
        version = item.get("version")
        if version != ft.Failure.DICT_VERSION:
            raise exc.InvalidFormat(
                f"{where}: failure dict version {version!r} is not"
                f" supported (expected {ft.Failure.DICT_VERSION})"
            )
        pending.extend(item.get("causes") or ())
