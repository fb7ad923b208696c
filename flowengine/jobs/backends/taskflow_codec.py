"""TaskFlow's msgpack encoding of Redis job postings (``compat='taskflow'``).

TaskFlow's Redis board stores each posting as msgpack written by
``oslo_serialization.msgpackutils``: binary and text kept apart
(``use_bin_type``), and Python values msgpack lacks as *extension types*
whose payload is itself msgpack. The codes are oslo's fixed ones: 0 a
UUID (its hex digits), 1 a datetime (a map of its fields, ``tz`` naming a
zone when aware), 4 a set and 5 a frozenset (a list), 7 a date (a map).
This module reads and writes that format with plain ``msgpack``, so
TaskFlow's boards read flowengine's postings and the other way round; an
extension type it does not know is kept as ``msgpack.ExtType``.

Needs the ``taskflow-compat`` extra (``msgpack``).
"""

from __future__ import annotations

import datetime
import uuid
import zoneinfo
from typing import Any

from flowengine.utils import optional

try:
    import msgpack
except ImportError as e:  # the 'taskflow-compat' extra is not installed
    raise optional.missing_extra("taskflow-compat", e) from e

from flowengine import exceptions as exc

__all__ = ["dumps", "loads"]

# oslo.serialization's reserved extension codes (its msgpackutils registry).
_UUID, _DATETIME, _SET, _FROZENSET, _DATE = 0, 1, 4, 5, 7
_CLOCK_FIELDS = ("hour", "minute", "second", "microsecond")


def _to_ext(value: Any) -> msgpack.ExtType:
    """The extension type of a value msgpack cannot write itself (TypeError if none)."""
    if isinstance(value, datetime.datetime):
        # oslo's field order, so both libraries write the same bytes.
        fields: dict[str, Any] = {"day": value.day, "month": value.month, "year": value.year}
        fields.update((f, getattr(value, f)) for f in _CLOCK_FIELDS)
        if value.tzinfo is not None:
            fields["tz"] = str(value.tzinfo)
        return msgpack.ExtType(_DATETIME, dumps(fields))
    if isinstance(value, datetime.date):
        return msgpack.ExtType(
            _DATE, dumps({"year": value.year, "month": value.month, "day": value.day})
        )
    if isinstance(value, uuid.UUID):
        return msgpack.ExtType(_UUID, value.hex.encode("ascii"))
    if isinstance(value, frozenset):
        return msgpack.ExtType(_FROZENSET, dumps(list(value)))
    if isinstance(value, set):
        return msgpack.ExtType(_SET, dumps(list(value)))
    raise TypeError(f"{type(value).__name__} values cannot be stored in a TaskFlow posting")


def _text_keys(fields: dict[Any, Any]) -> dict[str, Any]:
    # Old writers stored these maps with binary keys.
    return {k.decode("ascii") if isinstance(k, bytes) else k: v for k, v in fields.items()}


def _from_ext(code: int, data: bytes) -> Any:
    if code == _DATETIME:
        fields = _text_keys(loads_any(data))
        tz = fields.pop("tz", None)
        moment = datetime.datetime(
            **{k: fields[k] for k in ("year", "month", "day", *_CLOCK_FIELDS)}
        )
        if tz:
            zone = tz.decode("ascii") if isinstance(tz, bytes) else str(tz)
            moment = moment.replace(
                tzinfo=datetime.UTC if zone == "UTC" else zoneinfo.ZoneInfo(zone)
            )
        return moment
    if code == _DATE:
        fields = _text_keys(loads_any(data))
        return datetime.date(fields["year"], fields["month"], fields["day"])
    if code == _UUID:
        return uuid.UUID(hex=data.decode("ascii"))
    if code == _SET:
        return set(loads_any(data))
    if code == _FROZENSET:
        return frozenset(loads_any(data))
    return msgpack.ExtType(code, data)


def dumps(value: Any) -> bytes:
    """``value`` in TaskFlow's msgpack; JobFailure naming what cannot be written."""
    try:
        return msgpack.packb(value, default=_to_ext, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise exc.JobFailure(
            f"Cannot encode {type(value).__name__} as TaskFlow's msgpack: {e}", cause=e
        ) from e


def loads_any(blob: bytes) -> Any:
    """A value from TaskFlow's msgpack; ValueError (naming why) if ``blob`` is not that."""
    try:
        return msgpack.unpackb(blob, raw=False, ext_hook=_from_ext, strict_map_key=False)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
        raise ValueError(f"not TaskFlow's msgpack ({type(e).__name__}: {e})") from e


def loads(blob: bytes) -> dict[str, Any]:
    """A msgpack map (a posting); ValueError naming why ``blob`` is not one."""
    value = loads_any(blob)
    if not isinstance(value, dict):
        raise ValueError(f"a msgpack {type(value).__name__}, not a map")
    return value
