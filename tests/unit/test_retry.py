"""Tests for retry History and the built-in retry controllers."""

import pytest

from flowengine import exceptions as exc
from flowengine import retry, states
from flowengine.types.failure import Failure


def fail(error):
    try:
        raise error
    except Exception:
        return Failure()


def history(*attempts, failure=None):
    return retry.History(list(attempts), failure=failure)


def test_decisions_are_strings():
    assert retry.RETRY == "RETRY" == states.RETRY
    assert retry.REVERT == "REVERT" == states.REVERT
    assert retry.REVERT_ALL == "REVERT_ALL"
    assert retry.Decision("RETRY") is retry.Decision.RETRY
    assert str(retry.Decision.REVERT_ALL) == "REVERT_ALL"
    assert retry.EXECUTE == states.EXECUTE and retry.IGNORE == states.IGNORE


def test_history_accessors():
    f1 = fail(ValueError("v"))
    f2 = fail(KeyError("k"))
    own = fail(RuntimeError("retry itself"))
    h = history((1, {"a": f1}), (2, {"b": f2, "c": f1}), failure=own)
    assert len(h) == 2
    assert h[0] == (1, {"a": f1})
    assert list(h) == [(1, {"a": f1}), (2, {"b": f2, "c": f1})]
    assert list(h.provided_iter()) == [1, 2]
    assert list(h.outcomes_iter()) == [("a", f1), ("b", f2), ("c", f1)]
    assert list(h.outcomes_iter(index=1)) == [("b", f2), ("c", f1)]
    assert h.failure is own
    assert h.caused_by(KeyError)
    assert not h.caused_by(KeyError, index=0)
    assert not h.caused_by(RuntimeError)
    assert h.caused_by(RuntimeError, include_retry=True)
    assert "History" in repr(h)


def test_retry_history_is_not_a_requirement():
    r = retry.Times(3)
    assert list(r.requires) == []
    assert "history" not in r.rebind and "history" not in r.revert_rebind
    # Unnamed until a flow names it '<flow>_retry' (see test_flows).
    assert r.name is None


def test_times():
    r = retry.Times(attempts=3, provides="attempt")
    assert r.save_as == {"attempt": None}
    assert r.execute(history()) == 1
    assert r.on_failure(history()) == retry.RETRY
    h2 = history((1, {}), (2, {}))
    assert r.execute(h2) == 3
    assert r.on_failure(h2) == retry.RETRY
    h3 = history((1, {}), (2, {}), (3, {}))
    assert r.on_failure(h3) == retry.REVERT
    assert retry.Times(1, revert_all=True).on_failure(history((1, {}))) == retry.REVERT_ALL


def test_always_revert_and_revert_all():
    assert retry.AlwaysRevert().on_failure(history=history()) == retry.REVERT
    assert retry.AlwaysRevert().execute(history=history()) is None
    assert retry.AlwaysRevertAll().on_failure(history=history()) == retry.REVERT_ALL
    assert retry.AlwaysRevertAll().execute(history=history()) is None


def test_for_each_tries_each_value_once():
    r = retry.ForEach([3, 2, 1], provides="value")
    r.name = "for-each"
    assert r.execute(history()) == 3
    h = history((3, {}))
    assert r.on_failure(h) == retry.RETRY
    assert r.execute(h) == 2
    h = history((3, {}), (2, {}), (1, {}))
    assert r.on_failure(h) == retry.REVERT
    with pytest.raises(exc.NotFound) as info:
        r.execute(h)
    assert r.name in str(info.value)
    assert retry.ForEach([1], revert_all=True).on_failure(history((1, {}))) == retry.REVERT_ALL


def test_for_each_repeated_values():
    r = retry.ForEach([1, 1, 2])
    assert r.execute(history((1, {}))) == 1
    assert r.execute(history((1, {}), (1, {}))) == 2


def test_parameterized_for_each_requires_values():
    r = retry.ParameterizedForEach(provides="value")
    assert list(r.requires) == ["values"]
    assert r.execute(values=["a", "b"], history=history()) == "a"
    assert r.on_failure(values=["a", "b"], history=history(("a", {}))) == retry.RETRY
    assert r.on_failure(["a", "b"], history(("a", {}), ("b", {}))) == retry.REVERT
    rebound = retry.ParameterizedForEach(rebind={"values": "choices"})
    assert list(rebound.requires) == ["choices"]
    assert rebound.rebind == {"values": "choices"}


def test_custom_retry_argument_mapping():
    class Custom(retry.Retry):
        def execute(self, history, x, y=1):
            return x

        def on_failure(self, history, x, y=1):
            return retry.RETRY

    r = Custom(name="c")
    assert list(r.requires) == ["x"]
    assert list(r.optional) == ["y"]
    assert r.revert(history()) is None


def test_retry_is_abstract():
    with pytest.raises(TypeError):
        retry.Retry()
