"""Assorted small helpers used across the package."""

from __future__ import annotations

import datetime
import functools
import json
import os
import socket
import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar
from urllib import parse as urlparse

# Characters allowed in a URI scheme (RFC 3986, section 3.1).
_SCHEME_CHARS = frozenset(string.ascii_letters + string.digits + "+-.")


_E = TypeVar("_E", bound=BaseException)


def find_cause(error: BaseException, kind: type[_E]) -> _E | None:
    """The exception of ``kind`` that is ``error`` or lies behind it, or None.

    Follows the explicit ``__cause__`` first, then the implicit
    ``__context__`` (a client library wrapping a TLS error in its own, say),
    and stops at a cycle.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def get_version_string(obj: Any) -> str | None:
    """Return an object's version (tuple or str attribute ``version``) as '1.0'."""
    version = getattr(obj, "version", None)
    if isinstance(version, tuple):
        try:
            return _tuple_version(version)
        except TypeError:  # an unhashable part: nothing to share
            return ".".join(str(p) for p in version)
    if isinstance(version, list):
        return ".".join(str(p) for p in version)
    return None if version is None else str(version)


@functools.lru_cache(maxsize=256)
def _tuple_version(version: tuple[Any, ...]) -> str:
    # Every atom of a class has the same version tuple: one string for all.
    return ".".join(str(p) for p in version)


def sequence_minus(seq1: Iterable[Any], seq2: Iterable[Any]) -> list[Any]:
    """Return seq1's items minus seq2's, removing one occurrence per seq2 item."""
    result = list(seq1)
    for item in seq2:
        try:
            result.remove(item)
        except ValueError:
            pass
    return result


def as_int(obj: Any, quiet: bool = False) -> int | Any:
    """Convert obj to int; on failure raise TypeError, or return obj unchanged when quiet."""
    try:
        return int(obj)
    except (ValueError, TypeError):
        pass
    try:
        return int(float(obj))
    except (ValueError, TypeError):
        pass
    if not quiet:
        raise TypeError(f"Can not translate '{obj}' ({type(obj)}) to an integer")
    return obj


def clamp(
    value: float, minimum: float, maximum: float, on_clamped: Callable[[], Any] | None = None
) -> float:
    """Clamp value into [minimum, maximum], calling on_clamped if it had to."""
    if minimum > maximum:
        raise ValueError(
            f"Provided minimum '{minimum}' must be less than or equal"
            f" to the provided maximum '{maximum}'"
        )
    if value > maximum:
        value = maximum
    elif value < minimum:
        value = minimum
    else:
        return value
    if on_clamped is not None:
        on_clamped()
    return value


def fix_newlines(text: str, replacement: str = os.linesep) -> str:
    """Replace every kind of line ending in text with replacement."""
    return replacement.join(text.splitlines())


def millis_to_datetime(milliseconds: float) -> datetime.datetime:
    """Convert epoch milliseconds into a naive UTC datetime."""
    epoch = datetime.datetime(1970, 1, 1)
    return epoch + datetime.timedelta(milliseconds=milliseconds)


def pick_first_not_none(*values: Any) -> Any:
    """Return the first value that is not None (or None if all are)."""
    for value in values:
        if value is not None:
            return value
    return None


def get_hostname(unknown_hostname: str = "<unknown>") -> str:
    """Return this machine's hostname, or unknown_hostname if it cannot be found."""
    try:
        return socket.getfqdn() or socket.gethostname() or unknown_hostname
    except OSError:
        return unknown_hostname


def parse_uri(uri: str) -> urlparse.SplitResult:
    """Split a 'scheme://...' URI; raise ValueError when it has no valid scheme."""
    if not isinstance(uri, str):
        raise TypeError(f"Can only parse string types to uri data, not '{type(uri)}'")
    scheme, sep, _rest = uri.partition("://")
    if not sep or not scheme or not set(scheme) <= _SCHEME_CHARS:
        raise ValueError(f"Invalid uri '{uri}': expected 'scheme://...'")
    return urlparse.urlsplit(uri)


def mask_password(url: str) -> str:
    """``url`` with its password replaced by ``***``, for logs and errors.

    A URL without a password comes back unchanged (no ``:***@`` that would
    suggest one); a kombu failover list (``amqp://a;amqp://b``) is masked
    URL by URL.
    """
    if ";" in url:
        return ";".join(mask_password(part) for part in url.split(";"))
    try:
        parts = urlparse.urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>"
    if not password:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlparse.urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def merge_uri(uri: urlparse.SplitResult, conf: dict[str, Any]) -> dict[str, Any]:
    """Fill conf (in place, returned) from a parsed URI without overriding explicit keys."""
    for key, value in (
        ("username", uri.username),
        ("password", uri.password),
        ("hostname", uri.hostname),
        ("port", uri.port),
        ("path", uri.path or None),
    ):
        if value is not None:
            conf.setdefault(key, value)
    for key, values in urlparse.parse_qs(uri.query).items():
        conf.setdefault(key, values[-1] if len(values) == 1 else values)
    return conf


def binary_encode(text: str | bytes, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """Return text encoded to bytes (bytes pass through)."""
    if isinstance(text, bytes):
        return text
    return text.encode(encoding, errors)


def binary_decode(data: str | bytes, encoding: str = "utf-8", errors: str = "strict") -> str:
    """Return bytes decoded to text (text passes through)."""
    if isinstance(data, str):
        return data
    return data.decode(encoding, errors)


def decode_json(raw_data: str | bytes, root_types: tuple[type, ...] = (dict,)) -> Any:
    """Parse JSON and check its root type; raise ValueError describing any problem."""
    try:
        data = json.loads(binary_decode(raw_data))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"Expected JSON decodable data: {e}") from e
    if root_types and not isinstance(data, root_types):
        names = ", ".join(t.__name__ for t in root_types)
        raise ValueError(
            f"Expected JSON root to be one of ({names}) and not '{type(data).__name__}'"
        )
    return data


def is_json_serialisable(value: Any) -> bool:
    """Return whether json.dumps accepts value."""
    try:
        json.dumps(value)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return False
    return True


def ensure_tree(path: str) -> None:
    """Create a directory and its parents if missing."""
    os.makedirs(path, exist_ok=True)


def safe_copy_dict(obj: Mapping[Any, Any] | None) -> dict[Any, Any]:
    """Return a shallow dict copy of obj (an empty dict for None)."""
    return {} if not obj else dict(obj)


def is_iterable(obj: Any) -> bool:
    """Return whether obj is iterable but not a string/bytes."""
    if isinstance(obj, (str, bytes)):
        return False
    try:
        iter(obj)
    except TypeError:
        return False
    return True
