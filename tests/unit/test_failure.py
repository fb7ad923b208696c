"""Tests for Failure: capture, inspection, re-raise and the JSON round trip."""

import copy
import json
import pickle

import pytest

from flowengine import exceptions as exc
from flowengine.types.failure import Failure


class MyError(Exception):
    """A user exception outside builtins."""


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")


def capture(error):
    try:
        raise error
    except BaseException:
        return Failure()


def test_captures_current_exception():
    f = capture(RuntimeError("Woot!"))
    assert isinstance(f.exception, RuntimeError)
    assert f.exception_str == "Woot!"
    assert f.exception_args == ("Woot!",)
    assert f.exc_type_names == ("RuntimeError", "Exception")
    assert list(f) == ["RuntimeError", "Exception"]
    assert f.exc_info[0] is RuntimeError
    assert "capture" in f.traceback_str
    assert str(f) == "Failure: RuntimeError: Woot!"


def test_user_exception_names_are_qualified():
    f = capture(MyError("x"))
    assert f.exc_type_names == (f"{__name__}.MyError", "Exception")
    assert f.check(MyError) is MyError
    assert f.check(f"{__name__}.MyError") == f"{__name__}.MyError"


def test_base_exception_only_types_are_refused_as_taskflow_does():
    # SystemExit/KeyboardInterrupt are the process leaving, not a task failure.
    with pytest.raises(TypeError, match="Invalid exception type"):
        capture(KeyboardInterrupt())
    # Received ones (from older senders) still validate.
    Failure.validate(
        {
            "exception_str": "",
            "traceback_str": "",
            "version": 1,
            "exc_type_names": ["KeyboardInterrupt", "BaseException"],
        }
    )


def test_no_active_exception_is_a_type_error():
    with pytest.raises(TypeError):
        Failure()
    with pytest.raises(ValueError):
        Failure(exc_info=(1, 2))


def test_broken_str_does_not_break_capture():
    f = capture(Unprintable())
    assert "Unprintable" in f.exception_str


def test_from_exception_never_raised():
    f = Failure.from_exception(ValueError("v"))
    assert f.check(ValueError) is ValueError
    assert f.traceback_str == ""
    assert f.pformat(traceback=True).endswith("Traceback not available.")


def test_check_order_and_miss():
    f = capture(KeyError("k"))
    assert f.check(ValueError, LookupError, KeyError) is LookupError
    assert f.check(ValueError) is None
    assert f.check("Exception") == "Exception"


def test_reraise_original():
    f = capture(MyError("again"))
    with pytest.raises(MyError, match="again"):
        f.reraise()


def test_reraise_after_round_trip_is_wrapped():
    f = Failure.from_dict(capture(MyError("x")).to_dict())
    assert f.exception is None
    with pytest.raises(exc.WrappedFailure) as info:
        f.reraise()
    assert list(info.value) == [f]


def test_reraise_if_any():
    assert Failure.reraise_if_any([]) is None
    f1 = capture(ValueError("one"))
    with pytest.raises(ValueError):
        Failure.reraise_if_any(iter([f1]))
    f2 = capture(KeyError("two"))
    with pytest.raises(exc.WrappedFailure) as info:
        Failure.reraise_if_any([f1, f2])
    assert len(info.value) == 2


def test_to_dict_is_json_and_round_trips():
    f = capture(RuntimeError("Woot!", 3))
    data = f.to_dict()
    assert data["version"] == 1
    assert data["exc_args"] == ("Woot!", 3)  # a tuple, as TaskFlow
    Failure.validate(data)
    text = json.dumps(data)
    g = Failure.from_dict(json.loads(text))
    assert g.exception is None and g.exc_info is None
    assert g.exception_str == f.exception_str == "('Woot!', 3)"
    assert g.exc_type_names == f.exc_type_names
    assert g.traceback_str == f.traceback_str
    assert g.matches(f) and f.matches(g)
    assert str(g) == str(f)
    assert g.to_dict() == data


def test_to_dict_without_args_and_with_unserialisable_args():
    obj = object()
    f = capture(RuntimeError("r", obj))
    assert f.to_dict(include_args=False)["exc_args"] == ()
    args = f.to_dict()["exc_args"]
    assert args[0] == "r" and args[1] == repr(obj)
    json.dumps(f.to_dict())


def test_causes_follow_the_chain():
    try:
        try:
            try:
                raise KeyError("inner")
            except KeyError as e:
                raise ValueError("middle") from e
        except ValueError:
            raise RuntimeError("outer")  # implicit __context__
    except RuntimeError:
        f = Failure()
    assert [c.exception_str for c in f.causes] == ["middle", "'inner'"]
    assert f.causes[0].check(ValueError)
    data = f.to_dict()
    assert len(data["causes"]) == 2
    Failure.validate(data)
    g = Failure.from_dict(data)
    assert [c.exception_str for c in g.causes] == ["middle", "'inner'"]
    assert g.matches(f)


def test_suppressed_context_is_not_a_cause():
    try:
        try:
            raise KeyError("hidden")
        except KeyError:
            raise ValueError("shown") from None
    except ValueError:
        f = Failure()
    assert f.causes == ()


def test_equality_and_copy():
    f = capture(RuntimeError("a"))
    c = f.copy()
    assert c == f and c.matches(f)
    assert c is not f
    other = capture(RuntimeError("b"))
    assert f != other and not f.matches(other)
    assert not f.matches("not a failure")
    assert (f == "x") is False
    with pytest.raises(TypeError):
        hash(f)


def test_validate_accepts_good_and_names_problems():
    Failure.validate(capture(RuntimeError("x")).to_dict())
    with pytest.raises(exc.InvalidFormat) as info:
        Failure.validate({"exception_str": "x", "traceback_str": ""})
    assert "exc_type_names" in str(info.value)
    with pytest.raises(exc.InvalidFormat) as info:
        Failure.validate({"exception_str": 1, "traceback_str": "", "exc_type_names": ["E"]})
    assert "exception_str" in str(info.value)
    with pytest.raises(exc.InvalidFormat) as info:
        Failure.validate(
            {"exception_str": "x", "traceback_str": "", "exc_type_names": ["Foo", "Bar"]}
        )
    assert "'Bar' is not one of those types" in str(info.value)
    nested_bad = capture(RuntimeError("x")).to_dict()
    nested_bad["causes"] = [{"exception_str": "y"}]
    with pytest.raises(exc.InvalidFormat):
        Failure.validate(nested_bad)
    with pytest.raises(exc.InvalidFormat):
        Failure.validate("not a dict")


def test_from_dict_rejects_unknown_version():
    data = capture(RuntimeError("x")).to_dict()
    data["version"] = 99
    with pytest.raises(ValueError):
        Failure.from_dict(data)


def test_kwargs_constructor_rejects_unknown_keys():
    with pytest.raises(TypeError):
        Failure(exception_str="x", bogus=1)


def test_pformat_with_traceback():
    f = capture(RuntimeError("tb"))
    text = f.pformat(traceback=True)
    assert text.startswith("Failure: RuntimeError: tb")
    assert "Traceback (most recent call last):" in text


def test_pickles_through_json_form():
    f = capture(RuntimeError("p"))
    g = pickle.loads(pickle.dumps(f))
    assert g.matches(f)
    assert isinstance(g.exception, RuntimeError)
    local = capture(RuntimeError(lambda: None))  # unpicklable exception argument
    h = pickle.loads(pickle.dumps(local))
    assert h.exception is None and h.exception_str == local.exception_str


def test_copy_module_keeps_the_exception():
    f = capture(RuntimeError("c"))
    for clone in (copy.copy(f), copy.deepcopy(f)):
        assert clone == f
        assert isinstance(clone.exception, RuntimeError)
        assert clone.exc_info[2] is f.exc_info[2]
