"""Persistence models: logbooks hold flow details, flow details hold atom details.

Every model converts to and from a plain JSON-compatible ``dict``
(``to_dict``/``from_dict``) with exactly TaskFlow's keys; failures travel as
``Failure.to_dict()`` output. ``from_dict`` reports data written by something
else (or damaged on disk) precisely instead of half-loading it, including
data that records a ``FORMAT_VERSION_KEY`` newer than this flowengine reads.
"""

from __future__ import annotations

import copy as copy_mod
import datetime
import os
import zoneinfo
from collections.abc import Iterator
from typing import Any, Self

from flowengine import exceptions as exc
from flowengine import states
from flowengine.types import failure as ft

__all__ = [
    "ATOM_TYPES",
    "AtomDetail",
    "FORMAT_VERSION",
    "FORMAT_VERSION_KEY",
    "FlowDetail",
    "LogBook",
    "RetryDetail",
    "TaskDetail",
    "atom_detail_class",
    "atom_detail_type",
]

#: Version of the dict layout produced by ``to_dict`` (TaskFlow's); bump on
#: incompatible change.
FORMAT_VERSION = 1
#: Key of a layout version in data given to ``from_dict``. ``to_dict`` never
#: writes it (TaskFlow's dicts have no such key; absent means version 1, its
#: layout). flowengine's SQL backend keeps the version in a column of its own
#: and hands it in under this key; a future incompatible layout records its
#: version here so this one refuses it.
FORMAT_VERSION_KEY = "format_version"

_ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def generate_uuid() -> str:
    """Return a new random (version 4) uuid as a string, as ``str(uuid.uuid4())`` would.

    Every atom of a flow gets one when an engine prepares it; going through
    ``uuid.UUID`` costs four times as much as formatting the bytes here.
    """
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _marshal_time(when: datetime.datetime | None) -> str | None:
    if when is None:
        return None
    return when.isoformat()


def _unmarshal_time(kind: str, when: Any) -> datetime.datetime | None:
    """Accept ISO strings, epoch seconds, datetimes or TaskFlow's marshalled dicts."""
    if when is None or when == "":
        return None
    try:
        if isinstance(when, datetime.datetime):
            return when
        if isinstance(when, str):
            return datetime.datetime.fromisoformat(when.replace("Z", "+00:00"))
        if isinstance(when, (int, float)) and not isinstance(when, bool):
            return datetime.datetime.fromtimestamp(when, datetime.UTC)
        if isinstance(when, dict):
            # TaskFlow (oslo timeutils.marshall_now) stores the fields separately:
            # naive UTC, or with a 'tzname' when the time was aware.
            fields = ("year", "month", "day", "hour", "minute", "second", "microsecond")
            year, month, day, hour, minute, second, micro = (int(when[f]) for f in fields)
            zone = when.get("tzname")
            tz = datetime.UTC if zone in (None, "", "UTC", "UTC+00:00") else zoneinfo.ZoneInfo(zone)
            return datetime.datetime(
                year, month, day, hour, minute, min(second, 59), micro, tzinfo=tz
            ).astimezone(datetime.UTC)
    except (KeyError, TypeError, ValueError, OverflowError, zoneinfo.ZoneInfoNotFoundError) as e:
        raise exc.InvalidFormat(f"{kind} has an unreadable time {when!r}", cause=e)
    raise exc.InvalidFormat(f"{kind} has an unreadable time {when!r}")


def _check_data(kind: str, data: Any, required: tuple[str, ...]) -> None:
    """Raise InvalidFormat/IncompatibleVersion naming what is wrong with ``data``."""
    if not isinstance(data, dict):
        raise exc.InvalidFormat(f"{kind} data must be a dict, not {type(data).__name__}")
    version = data.get(FORMAT_VERSION_KEY, FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        raise exc.InvalidFormat(f"{kind} data has a non-integer {FORMAT_VERSION_KEY} {version!r}")
    if version > FORMAT_VERSION:
        raise exc.IncompatibleVersion(
            f"{kind} data (uuid {data.get('uuid')!r}) has {FORMAT_VERSION_KEY} {version};"
            f" this flowengine reads up to {FORMAT_VERSION}"
        )
    for key in required:
        if key not in data:
            raise exc.InvalidFormat(
                f"{kind} data (uuid {data.get('uuid')!r}) is missing required key {key!r}"
            )
    for key in ("name", "uuid"):
        if key in required and not isinstance(data[key], str):
            raise exc.InvalidFormat(
                f"{kind} data (uuid {data.get('uuid')!r}) has a non-string {key!r}: {data[key]!r}"
            )


def _fix_meta(data: dict[str, Any]) -> dict[str, Any]:
    # Old or foreign data may hold a non-dict meta; treat it as empty.
    meta = data.get("meta")
    return dict(meta) if isinstance(meta, dict) else {}


def _format_meta(meta: dict[str, Any] | None, indent: int) -> list[str]:
    if not meta:
        return []
    lines = ["%s- metadata:" % (" " * indent)]
    for key, value in meta.items():
        # Progress reads better as a percentage (as TaskFlow prints it).
        if key == "progress" and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = "%0.2f%%" % (value * 100.0)
        lines.append("{}+ {} = {}".format(" " * (indent + 2), key, value))
    return lines


def _format_shared(obj: Any, indent: int) -> list[str]:
    lines = []
    for attr in ("uuid", "state"):
        if hasattr(obj, attr):
            lines.append("{}- {} = {}".format(" " * indent, attr, getattr(obj, attr)))
    return lines


def _copy_fn(deep_copy: bool) -> Any:
    return copy_mod.deepcopy if deep_copy else (lambda x: x)


def _failure_from(kind: str, data: Any) -> ft.Failure | None:
    if not data:
        return None
    try:
        return ft.Failure.from_dict(data)
    except exc.FlowEngineError:
        raise
    except Exception as e:
        raise exc.InvalidFormat(f"{kind} has an unreadable failure: {e}", cause=e)


def _version_string(version: Any) -> str | None:
    if isinstance(version, (tuple, list)):
        return ".".join(str(v) for v in version)
    return None if version is None else str(version)


class LogBook:
    """A named collection of flow details (typically one per job or engine user)."""

    def __init__(self, name: str, uuid: str | None = None) -> None:
        self._uuid = uuid or generate_uuid()
        self._name = name
        self._flowdetails_by_id: dict[str, FlowDetail] = {}
        self.created_at: datetime.datetime | None = _utcnow()
        self.updated_at: datetime.datetime | None = None
        self.meta: dict[str, Any] = {}

    @property
    def uuid(self) -> str:
        """The unique identifier of this logbook."""
        return self._uuid

    @property
    def name(self) -> str:
        """The name of this logbook."""
        return self._name

    def add(self, fd: FlowDetail) -> None:
        """Add (or replace, by uuid) a flow detail; nothing is saved until a backend saves."""
        self._flowdetails_by_id[fd.uuid] = fd
        self.updated_at = _utcnow()

    def find(self, flow_uuid: str) -> FlowDetail | None:
        """Return the flow detail with this uuid, or None."""
        return self._flowdetails_by_id.get(flow_uuid)

    def __iter__(self) -> Iterator[FlowDetail]:
        return iter(list(self._flowdetails_by_id.values()))

    def __len__(self) -> int:
        return len(self._flowdetails_by_id)

    def pformat(self, indent: int = 0, linesep: str = os.linesep) -> str:
        """Format this logbook and its contents as indented text."""
        pad = " " * (indent + 1)
        lines = ["{}{}: '{}'".format(" " * indent, type(self).__name__, self.name)]
        lines.extend(_format_shared(self, indent + 1))
        lines.extend(_format_meta(self.meta, indent + 1))
        if self.created_at is not None:
            lines.append(f"{pad}- created_at = {self.created_at.strftime(_ISO_FORMAT)}")
        if self.updated_at is not None:
            lines.append(f"{pad}- updated_at = {self.updated_at.strftime(_ISO_FORMAT)}")
        for fd in self:
            lines.append(fd.pformat(indent=indent + 1, linesep=linesep))
        return linesep.join(lines)

    def merge(self, lb: LogBook, deep_copy: bool = False) -> LogBook:
        """Take the other logbook's attributes (not its flow details); return self."""
        if lb is self:
            return self
        copy_fn = _copy_fn(deep_copy)
        if self.meta != lb.meta:
            self.meta = copy_fn(lb.meta)
        self.created_at = lb.created_at
        self.updated_at = lb.updated_at
        return self

    def copy(self, retain_contents: bool = True) -> LogBook:
        """Shallow copy; flow details are shared (or dropped if not retain_contents)."""
        clone = copy_mod.copy(self)
        clone._flowdetails_by_id = dict(self._flowdetails_by_id) if retain_contents else {}
        clone.meta = dict(self.meta)
        return clone

    def to_dict(self, marshal_time: bool = True) -> dict[str, Any]:
        """Return this logbook (without its flow details) as a JSON-compatible dict.

        With ``marshal_time=False`` the times stay ``datetime`` objects (as
        TaskFlow's default); ``from_dict`` reads either form.
        """
        marshal = _marshal_time if marshal_time else (lambda x: x)
        return {
            "name": self.name,
            "meta": dict(self.meta),
            "uuid": self.uuid,
            "updated_at": marshal(self.updated_at),
            "created_at": marshal(self.created_at),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], unmarshal_time: bool = True) -> LogBook:
        """Build a logbook from ``to_dict`` output; raises InvalidFormat if malformed."""
        _check_data("LogBook", data, ("name", "uuid"))
        obj = cls(data["name"], uuid=data["uuid"])
        obj.created_at = _unmarshal_time(f"LogBook {obj.uuid!r}", data.get("created_at"))
        obj.updated_at = _unmarshal_time(f"LogBook {obj.uuid!r}", data.get("updated_at"))
        obj.meta = _fix_meta(data)
        return obj


class FlowDetail:
    """The persisted state of one flow: its state, metadata and atom details."""

    def __init__(self, name: str, uuid: str) -> None:
        self._uuid = uuid
        self._name = name
        self._atomdetails_by_id: dict[str, AtomDetail] = {}
        self.state: str | None = None
        self.meta: dict[str, Any] = {}

    @property
    def uuid(self) -> str:
        """The unique identifier of this flow detail."""
        return self._uuid

    @property
    def name(self) -> str:
        """The name of this flow detail."""
        return self._name

    def add(self, ad: AtomDetail) -> None:
        """Add (or replace, by uuid) an atom detail."""
        self._atomdetails_by_id[ad.uuid] = ad

    def find(self, ad_uuid: str) -> AtomDetail | None:
        """Return the atom detail with this uuid, or None."""
        return self._atomdetails_by_id.get(ad_uuid)

    def __iter__(self) -> Iterator[AtomDetail]:
        return iter(list(self._atomdetails_by_id.values()))

    def __len__(self) -> int:
        return len(self._atomdetails_by_id)

    def update(self, fd: FlowDetail) -> FlowDetail:
        """Take every attribute of ``fd`` (including its atom details); return self."""
        if fd is not self:
            self._atomdetails_by_id = fd._atomdetails_by_id
            self.state = fd.state
            self.meta = fd.meta
        return self

    def pformat(self, indent: int = 0, linesep: str = os.linesep) -> str:
        """Format this flow detail and its atom details as indented text."""
        lines = ["{}{}: '{}'".format(" " * indent, type(self).__name__, self.name)]
        lines.extend(_format_shared(self, indent + 1))
        lines.extend(_format_meta(self.meta, indent + 1))
        for ad in self:
            lines.append(ad.pformat(indent=indent + 1, linesep=linesep))
        return linesep.join(lines)

    def merge(self, fd: FlowDetail, deep_copy: bool = False) -> FlowDetail:
        """Take the other flow detail's state and meta (not its atoms); return self."""
        if fd is self:
            return self
        if self.meta != fd.meta:
            self.meta = _copy_fn(deep_copy)(fd.meta)
        self.state = fd.state
        return self

    def copy(self, retain_contents: bool = True) -> FlowDetail:
        """Shallow copy; atom details are shared (or dropped if not retain_contents)."""
        clone = copy_mod.copy(self)
        clone._atomdetails_by_id = dict(self._atomdetails_by_id) if retain_contents else {}
        clone.meta = dict(self.meta)
        return clone

    def to_dict(self) -> dict[str, Any]:
        """Return this flow detail (without its atom details) as a JSON-compatible dict."""
        return {
            "name": self.name,
            "meta": dict(self.meta),
            "state": self.state,
            "uuid": self.uuid,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FlowDetail:
        """Build a flow detail from ``to_dict`` output; raises InvalidFormat if malformed."""
        _check_data("FlowDetail", data, ("name", "uuid"))
        obj = cls(data["name"], data["uuid"])
        obj.state = data.get("state")
        obj.meta = _fix_meta(data)
        return obj


class AtomDetail:
    """The persisted state of one atom: state, intention, results, failures, meta.

    ``failure``/``results`` belong to ``execute``; ``revert_failure``/
    ``revert_results`` to ``revert``. Abstract: use TaskDetail or RetryDetail.
    """

    # An engine keeps one per atom for the whole run: slots save ~50 bytes
    # each (5 MB at 100,000 atoms) over an instance dict.
    __slots__ = (
        "_uuid",
        "_name",
        "state",
        "intention",
        "results",
        "failure",
        "revert_results",
        "revert_failure",
        "meta",
        "version",
    )

    def __init__(self, name: str, uuid: str) -> None:
        self._uuid = uuid
        self._name = name
        self.state: str | None = None
        self.intention: str = states.EXECUTE
        self.results: Any = None
        self.failure: ft.Failure | None = None
        self.revert_results: Any = None
        self.revert_failure: ft.Failure | None = None
        self.meta: dict[str, Any] = {}
        self.version: Any = None

    @property
    def uuid(self) -> str:
        """The unique identifier of this atom detail."""
        return self._uuid

    @property
    def name(self) -> str:
        """The name of the atom this detail belongs to."""
        return self._name

    @property
    def last_results(self) -> Any:
        """The most recent ``execute`` result."""
        return self.results

    def put(self, state: str, result: Any) -> bool:
        """Record ``result`` obtained in ``state``; return whether anything changed."""
        raise NotImplementedError

    def reset(self, state: str) -> None:
        """Forget results and failures, set ``state`` and intention EXECUTE."""
        raise NotImplementedError

    def copy(self) -> Self:
        """Shallow copy (results are shared, meta is copied)."""
        clone = copy_mod.copy(self)
        clone.meta = dict(self.meta)
        return clone

    def update(self, ad: AtomDetail) -> AtomDetail:
        """Take every attribute of ``ad``; return self."""
        if ad is not self:
            for attr in (
                "state",
                "intention",
                "meta",
                "failure",
                "results",
                "revert_results",
                "revert_failure",
                "version",
            ):
                setattr(self, attr, getattr(ad, attr))
        return self

    def merge(self, other: AtomDetail, deep_copy: bool = False) -> AtomDetail:
        """Take the other detail's attributes (failures are never deep-copied); return self."""
        if other is self:
            return self
        if type(other) is not type(self):
            raise exc.NotImplementedError(
                f"Can only merge with other {type(self).__name__} objects"
            )
        copy_fn = _copy_fn(deep_copy)
        self.state = other.state
        self.intention = other.intention
        # Failures hold tracebacks that cannot be deep-copied; Failure.copy does it.
        for attr in ("failure", "revert_failure"):
            fail = getattr(other, attr)
            setattr(self, attr, fail.copy() if (fail is not None and deep_copy) else fail)
        if self.meta != other.meta:
            self.meta = copy_fn(other.meta)
        if self.version != other.version:
            self.version = copy_fn(other.version)
        self.results = other.results
        self.revert_results = other.revert_results
        return self

    def _results_to_json(self) -> Any:
        return self.results

    def _results_from_json(self, data: Any) -> Any:
        return data

    def to_dict(self) -> dict[str, Any]:
        """Return this atom detail as a dict (failures via ``Failure.to_dict``)."""
        failure = self.failure
        revert_failure = self.revert_failure
        return {
            "failure": failure.to_dict() if failure is not None else None,
            "revert_failure": (revert_failure.to_dict() if revert_failure is not None else None),
            "meta": dict(self.meta),
            "name": self.name,
            "results": self._results_to_json(),
            "revert_results": self.revert_results,
            "state": self.state,
            "version": self.version,
            "intention": self.intention,
            "uuid": self.uuid,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AtomDetail:
        """Build an atom detail from ``to_dict`` output; raises InvalidFormat if malformed."""
        kind = cls.__name__
        _check_data(kind, data, ("name", "uuid"))
        obj = cls(data["name"], data["uuid"])
        where = f"{kind} {obj.uuid!r}"
        obj.state = data.get("state")
        obj.intention = data.get("intention") or states.EXECUTE
        obj.version = data.get("version")
        obj.meta = _fix_meta(data)
        obj.failure = _failure_from(where, data.get("failure"))
        obj.revert_failure = _failure_from(where, data.get("revert_failure"))
        obj.results = obj._results_from_json(data.get("results"))
        obj.revert_results = data.get("revert_results")
        return obj

    def pformat(self, indent: int = 0, linesep: str = os.linesep) -> str:
        """Format this atom detail as indented text."""
        pad = " " * (indent + 1)
        lines = ["{}{}: '{}'".format(" " * indent, type(self).__name__, self.name)]
        lines.extend(_format_shared(self, indent + 1))
        lines.append(f"{pad}- version = {_version_string(self.version)}")
        lines.append(f"{pad}- results = {self.results}")
        lines.append(f"{pad}- failure = {bool(self.failure)}")
        lines.extend(_format_meta(self.meta, indent + 1))
        return linesep.join(lines)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} name={self.name!r} uuid={self.uuid!r}"
            f" state={self.state!r} intention={self.intention!r}>"
        )


class TaskDetail(AtomDetail):
    """The persisted state of a task (``results`` is its last ``execute`` result)."""

    __slots__ = ()

    def reset(self, state: str) -> None:
        """Forget results and failures, set ``state`` and intention EXECUTE."""
        self.results = None
        self.failure = None
        self.revert_results = None
        self.revert_failure = None
        self.state = state
        self.intention = states.EXECUTE

    def put(self, state: str, result: Any) -> bool:
        """Record ``result`` obtained in ``state``; return whether anything changed.

        FAILURE + Failure sets ``failure``; REVERT_FAILURE sets
        ``revert_failure``; REVERTED sets ``revert_results``; anything else
        sets ``results`` (clearing stale failures and revert data).
        """
        altered = self.state != state
        self.state = state
        is_failure = isinstance(result, ft.Failure)
        if state == states.FAILURE and is_failure:
            altered = altered or self.failure is not result or self.results is not None
            self.failure = result
            self.results = None
        elif state == states.REVERT_FAILURE and is_failure:
            altered = altered or self.revert_failure is not result
            self.revert_failure = result
            self.revert_results = None
        elif state == states.REVERTED:
            altered = (
                altered or self.revert_results is not result or self.revert_failure is not None
            )
            self.revert_results = result
            self.revert_failure = None
        else:
            # Task results cannot be compared reliably; any new object is a change.
            altered = (
                altered
                or self.results is not result
                or self.failure is not None
                or self.revert_results is not None
                or self.revert_failure is not None
            )
            self.results = result
            self.failure = None
            self.revert_results = None
            self.revert_failure = None
        return altered


class RetryDetail(AtomDetail):
    """The persisted state of a retry: ``results`` is its history.

    History is a list of ``(result, {atom_name: Failure})`` pairs, one per
    attempt; it survives ``put`` and is only cleared by ``reset``.
    """

    __slots__ = ()

    def __init__(self, name: str, uuid: str) -> None:
        super().__init__(name, uuid)
        self.results = []

    def reset(self, state: str) -> None:
        """Clear the history and failures, set ``state`` and intention EXECUTE."""
        self.results = []
        self.failure = None
        self.revert_results = None
        self.revert_failure = None
        self.state = state
        self.intention = states.EXECUTE

    @property
    def last_results(self) -> Any:
        """The result of the latest attempt; NotFound if there was none."""
        try:
            return self.results[-1][0]
        except IndexError:
            raise exc.NotFound(f"Last results of retry '{self.name}' not found")

    @property
    def last_failures(self) -> dict[str, ft.Failure]:
        """The failures (by atom name) recorded for the latest attempt; NotFound if none."""
        try:
            failures: dict[str, ft.Failure] = self.results[-1][1]
            return failures
        except IndexError:
            raise exc.NotFound(f"Last failures of retry '{self.name}' not found")

    def put(self, state: str, result: Any) -> bool:
        """Record ``result``: a success appends a new attempt to the history."""
        self.state = state
        is_failure = isinstance(result, ft.Failure)
        if state == states.FAILURE and is_failure:
            self.failure = result
        elif state == states.REVERT_FAILURE and is_failure:
            self.revert_failure = result
        elif state == states.REVERTED:
            self.revert_results = result
            self.revert_failure = None
        else:
            self.results.append((result, {}))
            self.failure = None
        return True

    def copy(self) -> Self:
        """Shallow copy; the history list and its failure dicts are copied."""
        clone = super().copy()
        clone.results = [(data, dict(fails)) for (data, fails) in self.results]
        return clone

    def merge(self, other: AtomDetail, deep_copy: bool = False) -> RetryDetail:
        """Take the other detail's attributes and a copy of its history; return self."""
        if other is self:
            return self
        super().merge(other, deep_copy=deep_copy)
        history = []
        for data, fails in other.results:
            if deep_copy:
                fails = {k: f.copy() for k, f in fails.items()}
            history.append((data, dict(fails)))
        self.results = history
        return self

    def _results_to_json(self) -> Any:
        return [
            [data, {name: f.to_dict() for name, f in fails.items()}]
            for (data, fails) in self.results
        ]

    def _results_from_json(self, data: Any) -> Any:
        if not data:
            return []
        history = []
        try:
            for item, fails in data:
                history.append(
                    (
                        item,
                        {
                            name: _failure_from(f"RetryDetail {self.uuid!r}", f)
                            for name, f in fails.items()
                        },
                    )
                )
        except (TypeError, ValueError, AttributeError) as e:
            raise exc.InvalidFormat(
                f"RetryDetail {self.uuid!r} has a malformed history: {data!r}", cause=e
            )
        return history


_DETAIL_TO_NAME: dict[type[AtomDetail], str] = {
    RetryDetail: "RETRY_DETAIL",
    TaskDetail: "TASK_DETAIL",
}
_NAME_TO_DETAIL = {name: cls for cls, name in _DETAIL_TO_NAME.items()}
ATOM_TYPES = list(_NAME_TO_DETAIL)


def atom_detail_class(atom_type: str) -> type[AtomDetail]:
    """Return the detail class for a type name ('TASK_DETAIL', 'RETRY_DETAIL')."""
    try:
        return _NAME_TO_DETAIL[atom_type]
    except (KeyError, TypeError):
        raise TypeError(f"Unknown atom type '{atom_type}'")


def atom_detail_type(atom_detail: AtomDetail) -> str:
    """Return the type name of an atom detail instance."""
    try:
        return _DETAIL_TO_NAME[type(atom_detail)]
    except KeyError:
        raise TypeError(f"Unknown atom '{atom_detail}' ({type(atom_detail)})")
