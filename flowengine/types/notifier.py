"""Notifier: publish/subscribe of events to registered callbacks."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Self

from flowengine.utils import reflection

LOG = logging.getLogger(__name__)

DetailsFilter = Callable[[Any], Any]


#: The topics of a notifier nobody registered with (never changed in place).
_NO_TOPICS: dict[str, Any] = {}


@functools.lru_cache(maxsize=64)
def _event_set(events: tuple[str, ...]) -> frozenset[str]:
    return frozenset(events)


class Listener:
    """One registered callback (with its extra args and optional details filter)."""

    __slots__ = ("_callback", "_details_filter", "_args", "_kwargs")

    def __init__(
        self,
        callback: Callable[..., Any],
        args: Iterable[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        details_filter: DetailsFilter | None = None,
    ) -> None:
        self._callback = callback
        self._details_filter = details_filter
        self._args = tuple(args) if args else ()
        self._kwargs = dict(kwargs) if kwargs else {}

    @property
    def callback(self) -> Callable[..., Any]:
        """The callback called with (event_type, *args, details=..., **kwargs)."""
        return self._callback

    @property
    def details_filter(self) -> DetailsFilter | None:
        """Callable that may veto a call by returning a falsey value for the details."""
        return self._details_filter

    @property
    def args(self) -> tuple[Any, ...]:
        """Extra positional arguments passed to the callback."""
        return self._args

    @property
    def kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments passed to the callback (a copy)."""
        return dict(self._kwargs)

    def __call__(self, event_type: str, details: Any) -> None:
        if self._details_filter is not None and not self._details_filter(details):
            return
        if self._kwargs:
            self._callback(event_type, *self._args, details=details, **self._kwargs)
        else:
            self._callback(event_type, *self._args, details=details)

    def is_equivalent(
        self, callback: Callable[..., Any], details_filter: DetailsFilter | None = None
    ) -> bool:
        """Return whether this listener wraps callback with the same details filter."""
        if not reflection.is_same_callback(self._callback, callback):
            return False
        if details_filter is None:
            return self._details_filter is None
        if self._details_filter is None:
            return False
        return reflection.is_same_callback(self._details_filter, details_filter)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Listener):
            return NotImplemented
        return self.is_equivalent(other._callback, details_filter=other._details_filter)

    # Equal listeners may differ in identity (equality compares callbacks), so
    # no hash; typeshed types __hash__ as a method, hence the ignore.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        text = f"{type(self).__name__} object at 0x{id(self):x} calling into '{self._callback!r}'"
        if self._details_filter is not None:
            text += f" using details filter '{self._details_filter!r}'"
        return f"<{text}>"


class Notifier:
    """Calls the callbacks registered for an event type (or for ANY) when it is notified.

    Registration is copy-on-write: notify() reads an immutable snapshot, so it
    is safe to notify from several threads while another registers.
    """

    #: Keyword the details are passed under; callbacks' kwargs may not use it.
    RESERVED_KEYS = ("details",)

    #: Register for this event type to receive every event.
    ANY = "*"

    _DISALLOWED_NOTIFICATION_EVENTS = frozenset((ANY,))

    def __init__(self) -> None:
        # event type -> tuple of listeners; empty tuples are removed so that
        # "nothing registered" is a single falsy check on the hot path. The
        # dict is replaced, never changed in place (see register), so every
        # fresh notifier can start with the same empty one.
        self._topics: dict[str, tuple[Listener, ...]] = _NO_TOPICS

    def __len__(self) -> int:
        return sum(len(listeners) for listeners in self._topics.values())

    def __bool__(self) -> bool:
        # Whether anything is registered, without counting (empty topics are
        # removed): engines ask before building an event's details.
        return bool(self._topics)

    def is_registered(
        self,
        event_type: str,
        callback: Callable[..., Any],
        details_filter: DetailsFilter | None = None,
    ) -> bool:
        """Return whether callback (with that details filter) is registered for event_type."""
        return any(
            listener.is_equivalent(callback, details_filter=details_filter)
            for listener in self._topics.get(event_type, ())
        )

    def reset(self) -> None:
        """Forget every registered callback."""
        self._topics = _NO_TOPICS

    def notify(self, event_type: str, details: dict[str, Any] | None) -> None:
        """Call every listener for event_type and ANY; their exceptions are logged, not raised.

        Each listener gets its own shallow copy of details.
        """
        topics = self._topics
        if not topics:
            return
        if not self.can_trigger_notification(event_type):
            LOG.debug("Event type '%s' is not allowed to trigger notifications", event_type)
            return
        any_listeners = topics.get(self.ANY, ())
        listeners = topics.get(event_type, ())
        if any_listeners:
            listeners = any_listeners + listeners
        elif not listeners:
            return
        if not details:
            details = {}
        for listener in listeners:
            try:
                listener(event_type, details.copy())
            except Exception:
                LOG.warning(
                    "Failure calling listener %s to notify about event %s, details: %s",
                    listener,
                    event_type,
                    details,
                    exc_info=True,
                )

    def register(
        self,
        event_type: str,
        callback: Callable[..., Any],
        args: Iterable[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        details_filter: DetailsFilter | None = None,
    ) -> None:
        """Call callback(event_type, *args, details=..., **kwargs) on each event_type event.

        Raises ValueError for a non-callable, a disallowed event type or a
        duplicate registration, KeyError when kwargs uses a reserved key.
        """
        if not callable(callback):
            raise ValueError("Event callback must be callable")
        if details_filter is not None and not callable(details_filter):
            raise ValueError("Details filter must be callable")
        if not self.can_be_registered(event_type):
            raise ValueError(
                f"Disallowed event type '{event_type}' can not have a callback registered"
            )
        if self.is_registered(event_type, callback, details_filter=details_filter):
            raise ValueError("Event callback already registered with equivalent details filter")
        if kwargs:
            for key in self.RESERVED_KEYS:
                if key in kwargs:
                    raise KeyError(f"Reserved key '{key}' not allowed in kwargs")
        listener = Listener(callback, args=args, kwargs=kwargs, details_filter=details_filter)
        topics = dict(self._topics)
        topics[event_type] = topics.get(event_type, ()) + (listener,)
        self._topics = topics

    def deregister(
        self,
        event_type: str,
        callback: Callable[..., Any],
        details_filter: DetailsFilter | None = None,
    ) -> bool:
        """Remove one listener; return whether one was found."""
        listeners = self._topics.get(event_type, ())
        for i, listener in enumerate(listeners):
            if listener.is_equivalent(callback, details_filter=details_filter):
                remaining = listeners[:i] + listeners[i + 1 :]
                topics = dict(self._topics)
                if remaining:
                    topics[event_type] = remaining
                else:
                    del topics[event_type]
                # Back to the shared empty table when nothing is left (the
                # engine registers and removes a callback around each task).
                self._topics = topics or _NO_TOPICS
                return True
        return False

    def deregister_event(self, event_type: str) -> int:
        """Remove every listener of event_type; return how many there were."""
        topics = dict(self._topics)
        removed = topics.pop(event_type, ())
        self._topics = topics
        return len(removed)

    def copy(self) -> Self:
        """Return a notifier with the same listeners (registrations are then independent)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._topics = dict(self._topics)
        return clone

    def listeners_iter(self) -> Iterator[tuple[str, list[Listener]]]:
        """Yield (event_type, listeners) for every event type with listeners."""
        for event_type, listeners in self._topics.items():
            if listeners:
                yield event_type, list(listeners)

    def can_be_registered(self, event_type: str) -> bool:
        """Return whether callbacks may be registered for event_type."""
        return True

    def can_trigger_notification(self, event_type: str) -> bool:
        """Return whether notifying event_type calls anything (ANY itself cannot)."""
        return event_type not in self._DISALLOWED_NOTIFICATION_EVENTS


class RestrictedNotifier(Notifier):
    """A notifier that only accepts registrations for declared event types (and ANY)."""

    def __init__(self, watchable_events: Iterable[str], allow_any: bool = True) -> None:
        super().__init__()
        # Every task declares the same events: share one frozenset per tuple.
        self._watchable_events = _event_set(tuple(watchable_events))
        self._allow_any = allow_any

    def events_iter(self) -> Iterator[str]:
        """Yield the event types that may be registered for (ANY excluded)."""
        return iter(self._watchable_events)

    def can_be_registered(self, event_type: str) -> bool:
        """Return whether event_type was declared (or is ANY and ANY is allowed)."""
        return event_type in self._watchable_events or (event_type == self.ANY and self._allow_any)


@contextlib.contextmanager
def register_deregister(
    notifier: Notifier,
    event_type: str,
    callback: Callable[..., Any] | None = None,
    args: Iterable[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    details_filter: DetailsFilter | None = None,
) -> Iterator[None]:
    """Register callback for the duration of a with-block (nothing if callback is None)."""
    if callback is None:
        yield
        return
    notifier.register(event_type, callback, args=args, kwargs=kwargs, details_filter=details_filter)
    try:
        yield
    finally:
        notifier.deregister(event_type, callback, details_filter=details_filter)
