"""Tests for the flowengine error hierarchy."""

import pytest

from flowengine import exceptions as exc
from flowengine.types.failure import Failure


def _failure(error):
    try:
        raise error
    except BaseException:
        return Failure()


def test_root_alias_catches_every_library_error():
    # Given TaskFlow programs catch TaskFlowException
    for cls in (
        exc.StorageFailure,
        exc.RequestTimeout,
        exc.InvalidState,
        exc.AmbiguousDependency,
        exc.CompilationFailure,
        exc.Duplicate,
        exc.InvalidFormat,
        exc.UnknownTask,
        exc.SerializationFailure,
        exc.ResultMismatch,
        exc.DisallowedAccess,
    ):
        # Then every library error is one
        assert issubclass(cls, exc.TaskFlowException)
        assert issubclass(cls, exc.FlowEngineError)
    assert exc.TaskFlowException is exc.FlowEngineError


def test_hierarchy_matches_taskflow():
    assert issubclass(exc.RequestTimeout, exc.ExecutionFailure)
    assert issubclass(exc.InvalidState, exc.ExecutionFailure)
    assert issubclass(exc.MissingDependencies, exc.DependencyFailure)
    assert issubclass(exc.AmbiguousDependency, exc.DependencyFailure)
    assert issubclass(exc.ResultMismatch, exc.NotFound)
    assert issubclass(exc.NotImplementedError, NotImplementedError)


def test_every_class_has_a_docstring():
    for name in exc.__all__:
        obj = getattr(exc, name)
        assert obj.__doc__, name


def test_cause_and_pformat_chain():
    root = ValueError("bad value")
    mid = exc.NotFound("not there", cause=root)
    top = exc.StorageFailure("cannot save", cause=mid)
    assert top.cause is mid
    lines = str(top).splitlines()
    assert lines == ["cannot save", "  NotFound: not there", "    ValueError: bad value"]
    assert top.pformat(show_root_class=True).startswith("StorageFailure: cannot save")
    with pytest.raises(ValueError):
        top.pformat(indent=-1)


def test_missing_dependencies_message_and_attrs():
    e = exc.MissingDependencies("my-task", ["a", "b"])
    assert e.who == "my-task"
    assert e.missing_requirements == ["a", "b"]
    assert str(e) == (
        "'my-task' requires ['a', 'b'] but no other entity produces said requirements"
    )
    m = exc.MissingDependencies("t", ["x"], method="revert")
    assert str(m).startswith("'revert' method on 't' requires ['x']")


def test_raise_with_cause_uses_active_exception():
    with pytest.raises(exc.StorageFailure) as info:
        try:
            raise KeyError("k")
        except KeyError:
            exc.raise_with_cause(exc.StorageFailure, "wrapped")
    assert isinstance(info.value.cause, KeyError)
    assert info.value.__cause__ is info.value.cause


def test_raise_with_cause_explicit_and_rejects_foreign_classes():
    cause = OSError("disk")
    with pytest.raises(exc.NotFound) as info:
        exc.raise_with_cause(exc.NotFound, "gone", cause=cause)
    assert info.value.cause is cause
    with pytest.raises(ValueError):
        exc.raise_with_cause(RuntimeError, "nope")


def test_wrapped_failure_behaves_like_a_sequence():
    f1 = _failure(RuntimeError("Woot!"))
    f2 = _failure(ValueError("bad"))
    wf = exc.WrappedFailure([f1, f2])
    assert len(wf) == 2
    assert list(wf) == [f1, f2]
    assert wf[1] is f2
    assert wf.check(ValueError) is ValueError
    assert wf.check("RuntimeError") == "RuntimeError"
    assert wf.check(KeyError) is None
    assert wf.check() is None
    assert str(wf) == "WrappedFailure: [Failure: RuntimeError: Woot!, Failure: ValueError: bad]"


def test_wrapped_failure_flattens_nested():
    f1 = _failure(RuntimeError("a"))
    f2 = _failure(RuntimeError("b"))
    inner = _failure(exc.WrappedFailure([f1, f2]))
    f3 = _failure(KeyError("c"))
    wf = exc.WrappedFailure([inner, f3])
    assert list(wf) == [f1, f2, f3]


def test_root_class_keeps_taskflow_name():
    # Text naming the root class reads as TaskFlow's; both names are one class.
    assert exc.FlowEngineError is exc.TaskFlowException
    error = exc.TaskFlowException("Broken")
    assert error.pformat(show_root_class=True) == "TaskFlowException: Broken"
    assert error.pformat() == "Broken"
