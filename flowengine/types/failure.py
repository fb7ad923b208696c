"""Failure: a captured exception that can be inspected, re-raised and sent as JSON."""

from __future__ import annotations

import collections
import copy as copy_mod
import functools
import os
import pickle
import sys
import traceback
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, NoReturn

from flowengine import exceptions as exc
from flowengine.utils import reflection

ExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]

# Scalar types json encodes as-is; checking them avoids a json.dumps per arg.
_JSON_SCALARS = (str, int, float, bool, type(None))


# Marks a traceback string not formatted yet: formatting costs far more than
# capturing, and most failures are never printed.
class _NotFormatted:
    """Marks a traceback text not formatted yet (it is, on first use)."""


_NOT_FORMATTED = _NotFormatted()


@functools.lru_cache(maxsize=1024)
def _type_names(exc_type: type) -> tuple[str, ...]:
    # TaskFlow lists the MRO up to Exception; exceptions that only derive
    # from BaseException (KeyboardInterrupt...) end with 'BaseException'.
    up_to = Exception if issubclass(exc_type, Exception) else BaseException
    return tuple(reflection.get_all_class_names(exc_type, up_to=up_to))


def _exception_message(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        # A broken __str__ must not break failure capture.
        return repr(value)


def _json_arg(arg: Any) -> Any:
    if isinstance(arg, _JSON_SCALARS):
        return arg
    from flowengine.utils.misc import is_json_serialisable

    return arg if is_json_serialisable(arg) else repr(arg)


def _are_equal_exc_info_tuples(ei1: ExcInfo | None, ei2: ExcInfo | None) -> bool:
    if ei1 == ei2:
        return True
    if ei1 is None or ei2 is None:
        return False
    # Exceptions rarely define __eq__, so a copy would compare unequal: compare
    # type, message and repr instead, then the formatted tracebacks.
    if ei1[0] is not ei2[0] or type(ei1[1]) is not type(ei2[1]):
        return False
    if _exception_message(ei1[1]) != _exception_message(ei2[1]):
        return False
    if repr(ei1[1]) != repr(ei2[1]):
        return False
    if ei1[2] is ei2[2] or ei1[2] is None or ei2[2] is None:
        # A missing traceback (unpickled failure) is compared via traceback_str.
        return True
    return traceback.format_tb(ei1[2]) == traceback.format_tb(ei2[2])


class Failure:
    """An immutable record of an exception: inspect, re-raise, or send it as JSON."""

    __slots__ = (
        "_exc_info",
        "_exc_args",
        "_exc_type_names",
        "_exception_str",
        "_traceback_str",
        "_causes",
    )

    DICT_VERSION = 1

    #: Every valid ``exc_type_names`` list ends with one of these.
    BASE_EXCEPTIONS = ("BaseException", "Exception")

    #: JSON schema of :meth:`to_dict` output (nested causes included).
    SCHEMA: dict[str, Any] = {
        "$ref": "#/definitions/cause",
        "definitions": {
            "cause": {
                "type": "object",
                "properties": {
                    "version": {"type": "integer", "minimum": 0},
                    "exc_args": {"type": "array", "minItems": 0},
                    "exception_str": {"type": "string"},
                    "traceback_str": {"type": "string"},
                    "exc_type_names": {
                        "type": "array",
                        "items": {"type": "string"},
                        "minItems": 1,
                    },
                    "causes": {
                        "type": "array",
                        "items": {"$ref": "#/definitions/cause"},
                    },
                },
                "required": ["exception_str", "traceback_str", "exc_type_names"],
                "additionalProperties": True,
            },
        },
    }

    def __init__(self, exc_info: ExcInfo | None = None, **kwargs: Any) -> None:
        if not kwargs:
            if exc_info is None:
                exc_info = sys.exc_info()
            elif len(exc_info) != 3:
                raise ValueError("Provided 'exc_info' must contain three elements")
            exc_type, exc_value = exc_info[0], exc_info[1]
            # Exceptions only, as TaskFlow: SystemExit and KeyboardInterrupt
            # are not task failures to record but the process leaving.
            if not (isinstance(exc_type, type) and issubclass(exc_type, Exception)):
                raise TypeError(f"Invalid exception type '{exc_type}' ({type(exc_type)})")
            # Any 3-item sequence is accepted (TaskFlow callers pass lists).
            self._exc_info: ExcInfo | None = (exc_info[0], exc_info[1], exc_info[2])
            self._exc_args: tuple[Any, ...] = tuple(getattr(exc_value, "args", ()))
            # mypy does not see type objects as Hashable (python/mypy#11470).
            self._exc_type_names: tuple[str, ...] = _type_names(exc_type)  # type: ignore[arg-type]
            self._exception_str: str = _exception_message(exc_value)
            self._traceback_str: str | None | _NotFormatted = _NOT_FORMATTED
            self._causes: tuple[Failure, ...] | None = None
        else:
            causes = kwargs.pop("causes", None)
            self._causes = tuple(causes) if causes is not None else None
            # Kept as given, as a tuple (a failure rebuilt from its fields
            # normally has none: tracebacks do not cross processes).
            self._exc_info = tuple(exc_info) if exc_info else None  # type: ignore[assignment]
            self._exc_args = tuple(kwargs.pop("exc_args", ()))
            try:
                self._exception_str = kwargs.pop("exception_str")
            except KeyError:
                raise TypeError(
                    "Failure.__init__ requires 'exception_str' when built from keyword arguments"
                ) from None
            self._exc_type_names = tuple(kwargs.pop("exc_type_names", ()))
            self._traceback_str = kwargs.pop("traceback_str", None)
            if kwargs:
                raise TypeError(
                    "Failure.__init__ got unexpected keyword argument(s): "
                    + ", ".join(sorted(kwargs))
                )

    @classmethod
    def from_exception(cls, exception: BaseException) -> Failure:
        """Build a failure from an exception instance (its traceback if it has one)."""
        return cls((type(exception), exception, exception.__traceback__))

    # Inspection.

    @property
    def exception(self) -> BaseException | None:
        """The exception object, or None (lost once the failure crossed JSON)."""
        return self._exc_info[1] if self._exc_info else None

    @property
    def exception_str(self) -> str:
        """The exception's message."""
        return self._exception_str

    @property
    def exception_args(self) -> tuple[Any, ...]:
        """The arguments the exception was constructed with."""
        return self._exc_args

    @property
    def exc_info(self) -> ExcInfo | None:
        """The (type, value, traceback) triple, or None after deserialisation."""
        return self._exc_info

    @property
    def exc_type_names(self) -> tuple[str, ...]:
        """Class names of the exception, most derived first, ending at Exception."""
        return self._exc_type_names

    @property
    def traceback_str(self) -> str | None:
        """The formatted traceback (empty when the exception was never raised)."""
        if isinstance(self._traceback_str, _NotFormatted):
            tb = self._exc_info[2] if self._exc_info else None
            self._traceback_str = "".join(traceback.format_tb(tb)) if tb else ""
        return self._traceback_str

    @property
    def causes(self) -> tuple[Failure, ...]:
        """Failures for the chain of exceptions that led to this one (not itself)."""
        if self._causes is None:
            self._causes = tuple(self._extract_causes(self.exception))
        return self._causes

    @classmethod
    def _extract_causes(cls, value: BaseException | None) -> Iterator[Failure]:
        seen = [value]
        while value is not None:
            # PEP 3134: explicit __cause__ first, then the implicit __context__
            # unless it was suppressed with 'raise ... from ...' (PEP 415).
            nxt = value.__cause__
            if nxt is None and not value.__suppress_context__:
                nxt = value.__context__
            if nxt is None or any(nxt is s for s in seen):
                return
            seen.append(nxt)
            yield cls((type(nxt), nxt, nxt.__traceback__))
            value = nxt

    def check(self, *exc_classes: type[BaseException] | str) -> Any:
        """Return the first of exc_classes (types or names) this failure is an instance of."""
        for cls in exc_classes:
            name = reflection.get_class_name(cls) if isinstance(cls, type) else cls
            if name in self._exc_type_names:
                return cls
        return None

    def __iter__(self) -> Iterator[str]:
        return iter(self._exc_type_names)

    # Re-raising.

    def reraise(self) -> NoReturn:
        """Raise the original exception, or WrappedFailure([self]) if it was lost."""
        if self._exc_info and self._exc_info[1] is not None:
            raise self._exc_info[1].with_traceback(self._exc_info[2])
        raise exc.WrappedFailure([self])

    @staticmethod
    def reraise_if_any(failures: Iterable[Failure]) -> None:
        """Re-raise one failure as itself, several as a WrappedFailure, none as nothing."""
        if not isinstance(failures, (list, tuple)):
            failures = list(failures)
        if len(failures) == 1:
            failures[0].reraise()
        elif len(failures) > 1:
            raise exc.WrappedFailure(failures)

    # Comparison.

    def _matches(self, other: Failure) -> bool:
        if self is other:
            return True
        return (
            self._exc_type_names == other._exc_type_names
            and self._exc_args == other._exc_args
            and self._exception_str == other._exception_str
            and (self.traceback_str or "") == (other.traceback_str or "")
            and len(self.causes) == len(other.causes)
            and all(a.matches(b) for a, b in zip(self.causes, other.causes))
        )

    def matches(self, other: Any) -> bool:
        """Return whether other describes the same failure (ignoring lost exc_info)."""
        if not isinstance(other, Failure):
            return False
        if self._exc_info is None or other._exc_info is None:
            return self._matches(other)
        return self == other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Failure):
            return NotImplemented
        return self._matches(other) and _are_equal_exc_info_tuples(self._exc_info, other._exc_info)

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    # Equality is looser than identity (a copy equals its original), so no hash.
    __hash__ = None  # type: ignore[assignment]

    # Formatting.

    def pformat(self, traceback: bool = False) -> str:
        """Return 'Failure: Type: message', plus the traceback when asked."""
        if self._exc_type_names:
            text = f"Failure: {self._exc_type_names[0]}: {self._exception_str}"
        else:
            text = f"Failure: {self._exception_str}"
        if not traceback:
            return text
        tb = (self.traceback_str or "").rstrip()
        if tb:
            return text + os.linesep + "Traceback (most recent call last):" + os.linesep + tb
        return text + os.linesep + "Traceback not available."

    def __str__(self) -> str:
        return self.pformat()

    def __repr__(self) -> str:
        return f"<{self.pformat()}>"

    # Serialisation (JSON-compatible dicts only).

    def to_dict(self, include_args: bool = True) -> dict[str, Any]:
        """Return a JSON-compatible dict (see SCHEMA); args not JSON-able become repr()."""
        return {
            "exception_str": self._exception_str,
            "traceback_str": self.traceback_str or "",
            "exc_type_names": list(self._exc_type_names),
            "version": self.DICT_VERSION,
            "exc_args": tuple(_json_arg(a) for a in self._exc_args) if include_args else (),
            "causes": [c.to_dict(include_args=include_args) for c in self.causes],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Failure:
        """Rebuild a failure from :meth:`to_dict` output (its exception object is gone).

        Raises ValueError when the dict version is not supported.
        """
        version = data.get("version")
        if version != cls.DICT_VERSION:
            raise ValueError(f"Invalid dict version of failure object: {version!r}")
        causes = data.get("causes")
        return cls(
            exception_str=data["exception_str"],
            traceback_str=data.get("traceback_str"),
            exc_type_names=data.get("exc_type_names", ()),
            exc_args=data.get("exc_args") or (),
            causes=tuple(cls.from_dict(c) for c in causes) if causes else (),
        )

    @classmethod
    def validate(cls, data: Any) -> None:
        """Check data against SCHEMA; raise InvalidFormat saying what is wrong."""
        import jsonschema.exceptions

        error = jsonschema.exceptions.best_match(_validator().iter_errors(data))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            suffix = f" (at '{where}')" if where else ""
            raise exc.InvalidFormat(
                "Failure data not of the expected format: " + error.message + suffix, error
            )
        pending = collections.deque([data])
        while pending:
            cause = pending.popleft()
            root = cause["exc_type_names"][-1]
            if root not in cls.BASE_EXCEPTIONS:
                raise exc.InvalidFormat(
                    "Failure data 'exc_type_names' must have an initial exception"
                    f" type that is one of {cls.BASE_EXCEPTIONS} types: '{root}' is"
                    " not one of those types"
                )
            pending.extend(cause.get("causes") or ())

    def copy(self) -> Failure:
        """Return an equal failure (the exception value shallow-copied)."""
        exc_info = None
        if self._exc_info is not None:
            exc_info = (self._exc_info[0], copy_mod.copy(self._exc_info[1]), self._exc_info[2])
        return Failure(
            exc_info=exc_info,
            exception_str=self._exception_str,
            traceback_str=self.traceback_str,
            exc_args=self._exc_args,
            exc_type_names=self._exc_type_names,
            causes=self._causes,
        )

    def __copy__(self) -> Failure:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> Failure:
        # Failures are immutable: a shallow copy is as good as a deep one.
        return self.copy()

    def __reduce__(self) -> tuple[Any, ...]:
        # Local process pools pickle results; tracebacks cannot be pickled, so
        # ship the JSON form plus the exception when that itself pickles.
        value = self.exception
        if value is not None:
            try:
                pickle.dumps(value)
            except Exception:
                value = None
        return (_rebuild, (self.to_dict(), value))


def _rebuild(data: dict[str, Any], value: BaseException | None) -> Failure:
    failure = Failure.from_dict(data)
    if value is not None:
        failure._exc_info = (type(value), value, None)
    return failure


@functools.cache
def _validator() -> Any:
    """Failure.SCHEMA's validator, compiled on first use.

    Importing jsonschema costs tens of milliseconds, and a local engine whose
    tasks all succeed never validates a failure: a process pays only when it
    reads one from a message or a store.
    """
    import jsonschema

    jsonschema.Draft7Validator.check_schema(Failure.SCHEMA)
    # to_dict() gives exc_args as a tuple (as TaskFlow): an array too, before JSON.
    tuples_are_arrays = jsonschema.Draft7Validator.TYPE_CHECKER.redefine(
        "array", lambda _checker, value: isinstance(value, (list, tuple))
    )
    # types-jsonschema leaves validators.extend unannotated.
    return jsonschema.validators.extend(  # type: ignore[no-untyped-call]
        jsonschema.Draft7Validator, type_checker=tuples_are_arrays
    )(Failure.SCHEMA)
