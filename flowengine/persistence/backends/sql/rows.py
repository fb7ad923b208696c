"""Conversion between persistence models and rows of the SQL backend's tables.

JSON columns are encoded here (SerializationFailure names the record and the
field before anything is written) and decoded here (InvalidFormat names the
table, the row's uuid and the column). Rows are TaskFlow's (see ``tables``):
times are naive UTC, an atom's version is a plain string, and a row without a
``format_version`` (written by TaskFlow) is read as version 1, TaskFlow's layout.
"""

from __future__ import annotations

import datetime
from typing import Any

from flowengine import exceptions as exc
from flowengine.persistence import models
from flowengine.persistence.backends import json_codec

__all__ = [
    "atom_from_row",
    "atom_to_row",
    "book_from_row",
    "book_to_row",
    "flow_from_row",
    "flow_to_row",
]

_ATOM_JSON = ("results", "failure", "revert_results", "revert_failure", "meta")


def _enc(value: Any, what: str, field: str) -> str | None:
    return None if value is None else json_codec.encode_field(value, what, field)


def _dec(row: Any, table: str, field: str) -> Any:
    text = getattr(row, field)
    if text is None:
        return None
    return json_codec.decode(text, f"table {table!r}, row uuid {row.uuid!r}, column {field!r}")


def _check_version(row: Any, table: str) -> int:
    """The row's layout version (NULL: TaskFlow wrote it, version 1); refuses newer ones."""
    version = row.format_version
    if version is None:
        return models.FORMAT_VERSION
    if version > models.FORMAT_VERSION:
        raise exc.IncompatibleVersion(
            f"Row uuid {row.uuid!r} of table {table!r} has format_version {version!r};"
            f" this flowengine reads up to {models.FORMAT_VERSION}"
        )
    return int(version)


def _utc(when: datetime.datetime | None) -> datetime.datetime | None:
    # Stored times are naive UTC (TaskFlow's convention): make them aware.
    if when is not None and when.tzinfo is None:
        return when.replace(tzinfo=datetime.UTC)
    return when


def _naive_utc(when: datetime.datetime | None) -> datetime.datetime | None:
    """``when`` as a naive UTC datetime, the form TaskFlow stores and reads."""
    if when is not None and when.tzinfo is not None:
        return when.astimezone(datetime.UTC).replace(tzinfo=None)
    return when


def _version_text(version: Any) -> str | None:
    """An atom's version as TaskFlow's column holds it: '1.0' (tuples joined)."""
    if version is None or isinstance(version, str):
        return version
    if isinstance(version, (tuple, list)):
        return ".".join(str(part) for part in version)
    return str(version)


def book_to_row(book: models.LogBook) -> dict[str, Any]:
    """Row values for a logbook."""
    what = json_codec.describe({"name": book.name, "uuid": book.uuid}, "LogBook")
    return {
        "uuid": book.uuid,
        "name": book.name,
        "meta": _enc(book.meta, what, "meta"),
        "created_at": _naive_utc(book.created_at),
        "updated_at": _naive_utc(book.updated_at),
        "format_version": models.FORMAT_VERSION,
    }


def book_from_row(row: Any) -> models.LogBook:
    """A logbook (without flow details) from its row."""
    version = _check_version(row, "logbooks")
    book = models.LogBook.from_dict(
        {
            "name": row.name,
            "uuid": row.uuid,
            "meta": _dec(row, "logbooks", "meta"),
            models.FORMAT_VERSION_KEY: version,
        }
    )
    book.created_at = _utc(row.created_at)
    book.updated_at = _utc(row.updated_at)
    return book


def flow_to_row(fd: models.FlowDetail) -> dict[str, Any]:
    """Row values for a flow detail (parent not included)."""
    what = json_codec.describe({"name": fd.name, "uuid": fd.uuid}, "FlowDetail")
    return {
        "uuid": fd.uuid,
        "name": fd.name,
        "state": fd.state,
        "meta": _enc(fd.meta, what, "meta"),
        "format_version": models.FORMAT_VERSION,
    }


def flow_from_row(row: Any) -> models.FlowDetail:
    """A flow detail (without atom details) from its row."""
    version = _check_version(row, "flowdetails")
    return models.FlowDetail.from_dict(
        {
            "name": row.name,
            "uuid": row.uuid,
            "state": row.state,
            "meta": _dec(row, "flowdetails", "meta"),
            models.FORMAT_VERSION_KEY: version,
        }
    )


def atom_to_row(ad: models.AtomDetail) -> dict[str, Any]:
    """Row values for an atom detail (parent not included)."""
    data = ad.to_dict()
    what = json_codec.describe(data, "AtomDetail")
    row = {
        "uuid": ad.uuid,
        "name": ad.name,
        "atom_type": models.atom_detail_type(ad),
        "state": data["state"],
        "intention": data["intention"],
        "version": _version_text(data["version"]),
        "format_version": models.FORMAT_VERSION,
    }
    for field in _ATOM_JSON:
        row[field] = _enc(data[field], what, field)
    return row


def atom_from_row(row: Any) -> models.AtomDetail:
    """An atom detail from its row."""
    version = _check_version(row, "atomdetails")
    try:
        cls = models.atom_detail_class(row.atom_type)
    except TypeError as e:
        raise exc.InvalidFormat(
            f"Row uuid {row.uuid!r} of table 'atomdetails': {e}", cause=e
        ) from e
    data = {field: _dec(row, "atomdetails", field) for field in _ATOM_JSON}
    data.update(
        name=row.name, uuid=row.uuid, state=row.state, intention=row.intention, version=row.version
    )
    data[models.FORMAT_VERSION_KEY] = version
    return cls.from_dict(data)
