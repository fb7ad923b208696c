"""Tests for flowengine.utils (reflection, misc, threading) and OrderedSet."""

import contextlib
import datetime
import functools
import importlib
import os
import sys
import threading
import types
import warnings

import pytest

from flowengine.types.sets import OrderedSet
from flowengine.utils import misc, reflection, threading_utils


class Thing:
    def method(self, a, b=1, *args, **kwargs):
        pass

    @classmethod
    def cmethod(cls, x):
        pass

    def __call__(self, z):
        pass


def func(a, b, c=3, *, d, e=5):
    pass


def test_get_class_name():
    assert reflection.get_class_name(Thing) == f"{__name__}.Thing"
    assert reflection.get_class_name(Thing()) == f"{__name__}.Thing"
    assert reflection.get_class_name(Thing, fully_qualified=False) == "Thing"
    assert reflection.get_class_name(RuntimeError) == "RuntimeError"
    assert (
        reflection.get_class_name(RuntimeError, truncate_builtins=False) == "builtins.RuntimeError"
    )


def test_get_all_class_names():
    assert list(reflection.get_all_class_names(KeyError, up_to=Exception)) == [
        "KeyError",
        "LookupError",
        "Exception",
    ]
    assert list(reflection.get_all_class_names(True))[-1] == "object"


def test_get_callable_name():
    assert reflection.get_callable_name(func) == f"{__name__}.func"
    assert reflection.get_callable_name(Thing().method) == f"{__name__}.Thing.method"
    assert reflection.get_callable_name(Thing.cmethod) == f"{__name__}.Thing.cmethod"
    assert reflection.get_callable_name(Thing()) == f"{__name__}.Thing"
    assert reflection.get_callable_name(len) == "builtins.len"


def test_get_callable_args():
    assert reflection.get_callable_args(func) == ["a", "b", "c", "d", "e"]
    assert reflection.get_callable_args(func, required_only=True) == ["a", "b", "d"]
    assert reflection.get_callable_args(Thing().method) == ["a", "b"]
    assert reflection.get_callable_args(Thing()) == ["z"]
    assert reflection.get_callable_args(functools.partial(func, 1)) == ["b", "c", "d", "e"]
    assert reflection.accepts_kwargs(Thing().method)
    assert not reflection.accepts_kwargs(func)


def test_is_same_callback():
    t = Thing()
    assert reflection.is_same_callback(t.method, t.method)
    assert not reflection.is_same_callback(t.method, Thing().method)
    assert reflection.is_same_callback(func, func)
    assert not reflection.is_same_callback(func, len)


def test_import_class():
    assert reflection.import_class("os.path:join") is os.path.join
    assert reflection.import_class("flowengine.task.FunctorTask").__name__ == "FunctorTask"
    with pytest.raises(ImportError):
        reflection.import_class("flowengine.task.Nope")
    with pytest.raises(ImportError):
        reflection.import_class("nodots")
    with pytest.raises(ImportError):
        reflection.import_class("no_such_module_xyz.Thing")


def test_misc_helpers():
    class V:
        version = (1, 2)

    assert misc.get_version_string(V()) == "1.2"
    assert misc.sequence_minus([1, 2, 2, 3], [2, 4]) == [1, 2, 3]
    assert misc.as_int("3") == 3 and misc.as_int("3.7") == 3
    assert misc.as_int("x", quiet=True) == "x"
    with pytest.raises(TypeError):
        misc.as_int("x")
    clamped = []
    assert misc.clamp(2, 0, 1, on_clamped=lambda: clamped.append(1)) == 1
    assert misc.clamp(0.5, 0, 1, on_clamped=lambda: clamped.append(1)) == 0.5
    assert clamped == [1]
    with pytest.raises(ValueError):
        misc.clamp(1, 2, 1)
    assert misc.fix_newlines("a\r\nb\rc\n", "|") == "a|b|c"
    assert misc.millis_to_datetime(1500) == datetime.datetime(1970, 1, 1, 0, 0, 1, 500000)
    assert misc.pick_first_not_none(None, 0, 1) == 0
    assert misc.is_iterable([1]) and not misc.is_iterable("s") and not misc.is_iterable(3)
    assert misc.is_json_serialisable({"a": [1]}) and not misc.is_json_serialisable(object())
    assert misc.binary_decode(misc.binary_encode("é")) == "é"
    assert misc.decode_json(b'{"a": 1}') == {"a": 1}
    with pytest.raises(ValueError):
        misc.decode_json("[1]")
    with pytest.raises(ValueError):
        misc.decode_json("{bad")
    assert misc.safe_copy_dict(None) == {}


def test_parse_and_merge_uri():
    uri = misc.parse_uri("memory://user:pw@host:5/path?x=1")
    assert uri.scheme == "memory"
    conf = misc.merge_uri(uri, {"hostname": "explicit"})
    assert conf == {
        "username": "user",
        "password": "pw",
        "hostname": "explicit",
        "port": 5,
        "path": "/path",
        "x": "1",
    }
    with pytest.raises(ValueError):
        misc.parse_uri("no-scheme")
    with pytest.raises(TypeError):
        misc.parse_uri(3)


def test_daemon_thread_is_not_started():
    done = threading.Event()
    t = threading_utils.daemon_thread(done.set)
    assert t.daemon and not threading_utils.is_alive(t)
    t.start()
    assert done.wait(5)
    t.join(5)
    assert isinstance(threading_utils.get_ident(), int)
    assert threading_utils.get_optimal_thread_count() >= 1


def test_ordered_set():
    s = OrderedSet(["b", "a", "b", "c"])
    assert list(s) == ["b", "a", "c"]
    assert len(s) == 3 and "a" in s
    assert s == {"a", "b", "c"}
    assert list(s | ["d", "a"]) == ["b", "a", "c", "d"]
    assert list(s - {"a"}) == ["b", "c"]
    assert list(s & {"c", "b"}) == ["b", "c"]
    assert list(s.union(["z"], ["y"])) == ["b", "a", "c", "z", "y"]
    assert list(s.difference(["b"], ["c"])) == ["a"]
    assert list(s.intersection(["a", "c"], ["c"])) == ["c"]
    assert s.issubset("abcd") and s.issuperset(["a"])
    assert s.copy() == s and s.copy() is not s
    assert hash(OrderedSet("ab")) == hash(OrderedSet("ba"))
    assert repr(OrderedSet()) == "OrderedSet([])"


class Base:
    def run(self, a, b=2):
        pass

    @staticmethod
    def static(x, y):
        pass

    @classmethod
    def klass(cls, q):
        pass


class Child(Base):
    pass


def test_cached_argument_lists_handle_binding_forms():
    # The same underlying function seen bound, unbound, static and via a subclass.
    assert reflection.get_callable_args(Base.run) == ["self", "a", "b"]
    assert reflection.get_callable_args(Base().run) == ["a", "b"]
    assert reflection.get_callable_args(Child().run, required_only=True) == ["a"]
    assert reflection.get_callable_args(Base().static) == ["x", "y"]
    assert reflection.get_callable_args(Child.klass) == ["q"]
    assert reflection.get_callable_args(Base.run) == ["self", "a", "b"]


@contextlib.contextmanager
def _eventlet_importable(importable):
    """eventlet_utils reloaded as if eventlet did (or did not) import; restored after."""
    from flowengine.utils import eventlet_utils

    saved = sys.modules.get("eventlet", _MISSING)
    sys.modules["eventlet"] = types.ModuleType("eventlet") if importable else None
    try:
        yield importlib.reload(eventlet_utils)
    finally:
        if saved is _MISSING:
            sys.modules.pop("eventlet", None)
        else:
            sys.modules["eventlet"] = saved
        importlib.reload(eventlet_utils)


_MISSING = object()


def test_eventlet_utils_without_eventlet():
    with _eventlet_importable(False) as eu:
        assert eu.EVENTLET_AVAILABLE is False
        with pytest.warns(DeprecationWarning, match="Eventlet support is deprecated"):
            with pytest.raises(RuntimeError, match="^Eventlet is not currently available$"):
                eu.check_for_eventlet()
        with pytest.warns(DeprecationWarning):
            with pytest.raises(ValueError, match="mine"):
                eu.check_for_eventlet(ValueError("mine"))
        with pytest.warns(DeprecationWarning):
            with pytest.raises(KeyError):
                eu.check_for_eventlet(KeyError)


def test_eventlet_utils_with_eventlet():
    with _eventlet_importable(True) as eu:
        assert eu.EVENTLET_AVAILABLE is True
        with pytest.warns(DeprecationWarning):
            assert eu.check_for_eventlet() is None
        with pytest.warns(DeprecationWarning):
            assert eu.check_for_eventlet(ValueError("unused")) is None


def _check_outcome(module):
    """What ``module.check_for_eventlet()`` raised (its text, or None) and warned."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            module.check_for_eventlet()
        except RuntimeError as e:
            raised = str(e)
        else:
            raised = None
    return raised, [(w.category, str(w.message)) for w in seen]


def test_eventlet_utils_matches_taskflows():
    tf_eu = pytest.importorskip("taskflow.utils.eventlet_utils")
    from flowengine.utils import eventlet_utils as eu

    assert eu.EVENTLET_AVAILABLE == tf_eu.EVENTLET_AVAILABLE
    assert _check_outcome(eu) == _check_outcome(tf_eu)
