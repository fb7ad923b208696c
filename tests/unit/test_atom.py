"""Tests for Atom argument mapping (requires, rebind, optional, inject, provides)."""

import pytest

from flowengine import atom


class Plain(atom.Atom):
    def execute(self, a, b, c=1):
        return a + b + c


class KwargsAtom(atom.Atom):
    def execute(self, a, **kwargs):
        return a


class WithRevert(atom.Atom):
    def execute(self, x):
        return x

    def revert(self, x, result, flow_failures, undo=False):
        pass


class Defaults(atom.Atom):
    default_provides = ("left", "right")

    def execute(self):
        return 1, 2


def test_name_version_str_repr():
    a = Plain()
    # Only tasks default to their class name; a retry is named by its flow.
    assert a.name is None
    assert a.version == (1, 0)
    assert a.priority == 0
    named = Plain(name="my-atom")
    assert str(named) == '"my-atom==1.0"'  # quoted, as TaskFlow 6.5 prints it
    assert repr(named) == f'<{__name__}.Plain "my-atom==1.0">'


def test_required_and_optional_from_signature():
    a = Plain()
    assert list(a.requires) == ["a", "b"]
    assert list(a.optional) == ["c"]
    assert a.rebind == {"a": "a", "b": "b", "c": "c"}


@pytest.mark.parametrize(
    "provides,save_as",
    [
        (None, {}),
        ("x", {"x": None}),
        (("x", "y"), {"x": 0, "y": 1}),
        (["x", "y"], {"x": 0, "y": 1}),
        ({"x"}, {"x": "x"}),
        (frozenset(["y"]), {"y": "y"}),
    ],
)
def test_provides_to_save_as(provides, save_as):
    a = Plain(provides=provides)
    assert a.save_as == save_as
    assert set(a.provides) == set(save_as)


def test_provides_order_is_kept():
    a = Plain(provides=["z", "a", "m"])
    assert list(a.provides) == ["z", "a", "m"]


def test_bad_provides_is_type_error():
    with pytest.raises(TypeError):
        Plain(provides=42)


def test_default_provides_used_only_when_not_given():
    assert Defaults().save_as == {"left": 0, "right": 1}
    assert Defaults(provides="whole").save_as == {"whole": None}


def test_rebind_as_list_is_positional_over_required_args():
    a = Plain(rebind=["x", "y"])
    assert a.rebind == {"a": "x", "b": "y", "c": "c"}
    assert list(a.requires) == ["x", "y"]
    assert list(a.optional) == ["c"]


def test_rebind_as_dict_including_optional_arg():
    a = Plain(rebind={"b": "bee", "c": "sea"})
    assert a.rebind == {"a": "a", "b": "bee", "c": "sea"}
    # A rebound optional argument becomes required (as in TaskFlow).
    assert list(a.requires) == ["a", "bee", "sea"]
    assert list(a.optional) == []


def test_rebind_unknown_argument_raises_naming_atom():
    with pytest.raises(ValueError) as info:
        Plain(name="n1", rebind={"zz": "q"})
    assert "n1" in str(info.value) and "zz" in str(info.value)
    with pytest.raises(ValueError):
        Plain(rebind=["x", "y", "extra", "more"])


def test_rebind_bad_type():
    with pytest.raises(TypeError):
        Plain(rebind=5)


def test_extra_list_rebind_goes_to_kwargs_when_accepted():
    a = KwargsAtom(rebind=["x", "y", "z"])
    assert a.rebind == {"a": "x", "y": "y", "z": "z"}
    assert list(a.requires) == ["x", "y", "z"]


def test_requires_extra_symbols_need_kwargs():
    a = KwargsAtom(requires=["extra"])
    assert list(a.requires) == ["a", "extra"]
    assert a.rebind["extra"] == "extra"
    a2 = KwargsAtom(requires="single")
    assert "single" in a2.requires
    with pytest.raises(ValueError):
        Plain(requires=["extra"])


def test_auto_extract_off_requires_explicit_mapping():
    with pytest.raises(ValueError) as info:
        Plain(name="manual", auto_extract=False)
    assert "Missing arguments for atom manual" in str(info.value)
    a = Plain(auto_extract=False, requires=["a", "b"])
    assert list(a.requires) == ["a", "b"]
    assert list(a.optional) == []
    assert a.rebind == {"a": "a", "b": "b"}


def test_ignore_list_removes_required_arg():
    a = Plain(ignore_list=["b"])
    assert list(a.requires) == ["a"]
    assert "b" not in a.rebind


def test_inject_removes_requirements():
    a = Plain(inject={"a": 1, "c": 3})
    assert list(a.requires) == ["b"]
    assert list(a.optional) == []
    assert a.inject == {"a": 1, "c": 3}
    # Injected by argument name even when the argument is rebound.
    rebound = Plain(rebind={"a": "sym"}, inject={"a": 1})
    assert "sym" not in rebound.requires


def test_revert_mapping_ignores_engine_arguments():
    a = WithRevert()
    assert list(a.requires) == ["x"]
    assert a.revert_rebind == {"x": "x", "undo": "undo"}
    assert list(a.revert_requires) == ["x"]
    assert list(a.revert_optional) == ["undo"]
    assert "result" not in a.revert_rebind and "flow_failures" not in a.revert_rebind


def test_revert_rebind_and_requires_are_separate():
    a = WithRevert(rebind={"x": "ex"}, revert_rebind={"x": "why"})
    assert a.rebind == {"x": "ex"}
    assert a.revert_rebind["x"] == "why"
    # requires is the union of what execute and revert need.
    assert list(a.requires) == ["ex", "why"]


def test_default_revert_maps_execute_requirements():
    a = Plain(requires=None)
    # Atom.revert takes **kwargs only: nothing required unless asked.
    assert a.revert_rebind == {}
    b = KwargsAtom(requires=["extra"], revert_requires=["undo_info"])
    assert list(b.revert_requires) == ["undo_info"]
    assert "undo_info" in b.requires


def test_hooks_exist_and_do_nothing():
    a = Plain()
    for hook in (a.pre_execute, a.post_execute, a.pre_revert, a.post_revert):
        assert hook() is None
    assert a.revert() is None


def test_atom_is_abstract():
    with pytest.raises(TypeError):
        atom.Atom()


class RevertTakesResult(atom.Atom):
    def execute(self, x, y=2):
        return x

    def revert(self, x, result, y=2, flow_failures=None):
        pass


class ExecuteTakesResult(atom.Atom):
    def execute(self, x, result):
        return x

    def revert(self, x, result):
        pass


def test_revert_taking_execute_arguments_plus_engine_ones_shares_the_mapping():
    a = RevertTakesResult(rebind={"x": "ex"})
    assert a.revert_rebind == a.rebind == {"x": "ex", "y": "y"}
    assert list(a.revert_requires) == list(a.requires) == ["ex"]
    assert list(a.revert_optional) == ["y"]


def test_engine_argument_taken_by_execute_is_fetched_for_execute_only():
    # 'result' is an ordinary symbol for execute, but the engine's for revert.
    a = ExecuteTakesResult()
    assert a.rebind == {"x": "x", "result": "result"}
    assert a.revert_rebind == {"x": "x"}
    assert list(a.requires) == ["x", "result"]


def test_atoms_mapped_by_signature_alone_share_sets_but_own_their_mapping():
    # Given two atoms of one class given no requires, rebind or inject
    first, second = Plain(name="one"), Plain(name="two")
    # Then the second reuses the first's symbol sets (nothing changes them)
    assert second.optional is first.optional
    assert second.requires == first.requires
    # But each has a mapping of its own: changing one leaves the other alone
    assert second.rebind == first.rebind == {"a": "a", "b": "b", "c": "c"}
    assert second.rebind is not first.rebind
    second.rebind["a"] = "other"
    assert first.rebind["a"] == "a"
    assert Plain(name="three").rebind["a"] == "a"
    # Nor does changing the first one's mapping leak into the atoms made later
    first.rebind["b"] = "changed"
    later = Plain(name="four")
    assert later.rebind["b"] == "b"
    assert "changed" not in later.requires


def test_atoms_given_their_own_symbols_are_mapped_each_for_itself():
    # Given atoms of one class, rebound differently
    plain = Plain()
    rebound = Plain(rebind={"a": "x"})
    injected = Plain(inject={"b": 2})
    # Then each mapping follows its own arguments, none borrowed from another
    assert plain.rebind["a"] == "a" and rebound.rebind["a"] == "x"
    assert set(plain.requires) == {"a", "b"}
    assert set(rebound.requires) == {"x", "b"}
    assert set(injected.requires) == {"a"}
    assert rebound.requires is not plain.requires
