"""Storage: states, results, injection, fetching, retries, persistence, threads."""

import contextlib
import threading

import pytest

from flowengine import exceptions as exc
from flowengine import retry, states, storage, task
from flowengine.persistence import helpers, models
from flowengine.persistence.backends import impl_memory
from flowengine.types import failure as ft


class Noop(task.Task):
    def execute(self, **kwargs):
        return None


def _failure(msg="Woot!"):
    try:
        raise RuntimeError(msg)
    except RuntimeError:
        return ft.Failure()


def _storage(backend=None):
    _book, fd = helpers.temporary_flow_detail(backend)
    return storage.Storage(fd, backend=backend)


@pytest.fixture
def s():
    return _storage()


def test_ensure_atoms_creates_pending_details(s):
    t = Noop("t")
    r = retry.Times(3, name="r")
    uuids = s.ensure_atoms([t, r])
    assert uuids == [s.get_atom_uuid("t"), s.get_atom_uuid("r")]
    assert s.get_atom_state("t") == states.PENDING
    assert s.get_atom_intention("t") == states.EXECUTE
    assert s.ensure_atom(Noop("t")) == uuids[0]  # idempotent by name


def test_ensure_rejects_bad_atoms(s):
    with pytest.raises(TypeError):
        s.ensure_atom(object())
    s.ensure_atom(Noop("x"))
    with pytest.raises(exc.Duplicate, match="'x'"):
        s.ensure_atom(retry.Times(name="x"))


def test_unknown_atom_is_not_found(s):
    with pytest.raises(exc.NotFound, match="'nope'"):
        s.get_atom_state("nope")


def test_states_intentions_and_persistence():
    backend = impl_memory.MemoryBackend()
    s = _storage(backend)
    s.ensure_atom(Noop("t"))
    s.set_atom_state("t", states.RUNNING)
    s.set_atom_intention("t", states.REVERT)
    assert s.get_atoms_states(["t"]) == {"t": (states.RUNNING, states.REVERT)}
    with contextlib.closing(backend.get_connection()) as conn:
        stored = conn.get_atom_details(s.get_atom_uuid("t"))
        assert (stored.state, stored.intention) == (states.RUNNING, states.REVERT)
        s.set_flow_state(states.RUNNING)
        fd = conn.get_flow_details(s.flow_uuid)
        assert fd.state == states.RUNNING and len(fd) == 1


def test_save_and_get_results(s):
    s.ensure_atom(Noop("t", provides="x"))
    with pytest.raises(exc.NotFound, match="'t'"):
        s.get("t")
    s.save("t", 5)
    assert s.get_execute_result("t") == 5
    assert s.fetch("x") == 5
    assert not s.has_failures()


def test_save_failure_and_failure_maps(s):
    s.ensure_atom(Noop("t"))
    fail = _failure()
    s.save("t", fail, states.FAILURE)
    assert s.get("t") is fail
    assert s.get_execute_failures() == {"t": fail}
    assert s.has_failures()
    s.set_atom_intention("t", states.REVERT)
    revert_fail = _failure("revert")
    s.save("t", revert_fail, states.REVERT_FAILURE)
    assert s.get_revert_result("t") is revert_fail
    assert s.get_revert_failures() == {"t": revert_fail}
    s.reset("t")
    assert not s.has_failures()
    assert s.get_atom_state("t") == states.PENDING


def test_failure_cache_survives_reload():
    backend = impl_memory.MemoryBackend()
    s = _storage(backend)
    s.ensure_atom(Noop("t"))
    s.save("t", _failure(), states.FAILURE)
    with contextlib.closing(backend.get_connection()) as conn:
        fd = conn.get_flow_details(s.flow_uuid)
    s2 = storage.Storage(fd, backend=backend)
    assert s2.has_failures()
    assert s2.get("t").check(RuntimeError) is not None


def test_revert_result(s):
    s.ensure_atom(Noop("t"))
    s.save("t", 1)
    s.set_atom_intention("t", states.REVERT)
    s.save("t", "undone", states.REVERTED)
    assert s.get_revert_result("t") == "undone"


@pytest.mark.parametrize(
    "provides, result, words",
    [
        (("a", "b", "c"), (1, 2), ["'t'", "'c'", "index 2", "length 2"]),
        ({"a", "b"}, {"a": 1}, ["'t'", "'b'", "key 'b'"]),
        (("a", "b"), None, ["'t'", "'a'", "NoneType"]),
    ],
)
def test_strict_results_mismatch_names_atom_symbol_and_index(s, provides, result, words):
    s.strict_results = True
    s.ensure_atom(Noop("t", provides=provides))
    with pytest.raises(exc.ResultMismatch) as info:
        s.save("t", result)
    for word in words:
        assert word in str(info.value)
    assert s.get_atom_state("t") == states.PENDING  # nothing was saved


def test_a_short_result_is_stored_with_a_warning_as_in_taskflow(s, caplog):
    s.ensure_atom(Noop("t", provides=("a", "b")))
    s.save("t", ["only a"])
    assert "declares it provides 'b' at index 1" in caplog.text
    assert s.get_atom_state("t") == states.SUCCESS and s.fetch("a") == "only a"
    with pytest.raises(exc.NotFound, match="^Unable to find result 'b'"):
        s.fetch("b")


def test_save_tuple_results_by_index(s):
    s.ensure_atom(Noop("t", provides=("a", "b")))
    s.save("t", (1, 2))
    assert (s.fetch("a"), s.fetch("b")) == (1, 2)


def test_inject_persistent_and_transient():
    backend = impl_memory.MemoryBackend()
    s = _storage(backend)
    s.inject({"a": 1})
    s.inject({"b": 2})
    s.inject({"lock": threading.Lock()}, transient=True)
    assert s.fetch("a") == 1 and s.fetch("b") == 2
    assert isinstance(s.fetch("lock"), type(threading.Lock()))
    with contextlib.closing(backend.get_connection()) as conn:
        fd = conn.get_flow_details(s.flow_uuid)
    s2 = storage.Storage(fd, backend=backend)
    assert s2.fetch_all() == {"a": 1, "b": 2}  # transient values are not persisted


def test_fetch_not_mapped(s):
    with pytest.raises(exc.NotFound, match="'nope'"):
        s.fetch("nope")


def test_fetch_of_pending_provider_raises(s):
    s.ensure_atom(Noop("t", provides="x"))
    with pytest.raises(exc.NotFound):
        s.fetch("x")
    assert s.fetch_all() == {}


def test_fetch_many_handlers(s):
    s.ensure_atoms([Noop("t1", provides="x"), Noop("t2", provides="x")])
    s.save("t1", 1)
    s.save("t2", 2)
    assert s.fetch("x") == 1
    assert s.fetch("x", many_handler=lambda values: values) == [1, 2]
    assert s.fetch_all() == {"x": [1, 2]}
    assert s.fetch_all(many_handler=lambda values: values[-1]) == {"x": 2}


def test_ignored_provider_is_skipped(s):
    s.ensure_atoms([Noop("t1", provides="x"), Noop("t2", provides="x")])
    s.set_atom_state("t1", states.IGNORE)
    s.save("t2", 2)
    assert s.fetch("x") == 2


def test_fetch_mapped_args_precedence(s):
    s.ensure_atoms([Noop("p", provides="x"), Noop("c")])
    s.save("p", "from-atom")
    assert s.fetch_mapped_args({"arg": "x"}, atom_name="c") == {"arg": "from-atom"}
    s.inject({"x": "from-store"})
    assert s.fetch_mapped_args({"arg": "x"}, atom_name="c") == {"arg": "from-store"}
    s.inject_atom_args("c", {"x": "persistent-local"}, transient=False)
    assert s.fetch_mapped_args({"arg": "x"}, atom_name="c") == {"arg": "persistent-local"}
    s.inject_atom_args("c", {"x": "transient-local"})
    assert s.fetch_mapped_args({"arg": "x"}, atom_name="c") == {"arg": "transient-local"}
    # Atom-scoped values do not leak to other atoms or to plain fetches.
    assert s.fetch("x") == "from-store"


def test_fetch_mapped_args_optional_and_missing(s):
    s.ensure_atom(Noop("c"))
    assert s.fetch_mapped_args({"a": "zz"}, atom_name="c", optional_args=["a"]) == {}
    with pytest.raises(exc.NotFound, match="'zz'"):
        s.fetch_mapped_args({"a": "zz"}, atom_name="c")


def test_fetch_mapped_args_respects_scope(s):
    s.ensure_atoms([Noop("far", provides="x"), Noop("near", provides="x"), Noop("c")])
    s.save("far", "far")
    s.save("near", "near")
    got = s.fetch_mapped_args({"a": "x"}, atom_name="c", scope_walker=[["near"], ["far"]])
    assert got == {"a": "near"}
    got = s.fetch_mapped_args({"a": "x"}, atom_name="c", scope_walker=[["far"]])
    assert got == {"a": "far"}
    with pytest.raises(exc.NotFound):
        s.fetch_mapped_args({"a": "x"}, atom_name="c", scope_walker=[])


def test_scope_fetcher_is_used():
    _book, fd = helpers.temporary_flow_detail()
    s = storage.Storage(fd, scope_fetcher=lambda name: [["b"]])
    s.ensure_atoms([Noop("a", provides="x"), Noop("b", provides="x"), Noop("c")])
    s.save("a", 1)
    s.save("b", 2)
    assert s.fetch_mapped_args({"v": "x"}, atom_name="c") == {"v": 2}


def test_fetch_unsatisfied_args(s):
    s.ensure_atoms([Noop("p", provides="x"), Noop("c")])
    s.inject({"y": 1})
    missing = s.fetch_unsatisfied_args(
        "c", {"a": "x", "b": "y", "c": "z", "d": "w"}, optional_args=["d"]
    )
    assert missing == {"c"}
    assert s.fetch_unsatisfied_args("c", {"a": "x"}, scope_walker=[]) == {"a"}


def test_fast_path_fetch_args(s):
    s.ensure_atoms([Noop("far", provides="x"), Noop("near", provides=("x", "y")), Noop("c")])
    s.save("far", "far")
    s.save("near", ("near-x", "near-y"))
    providers = {"x": ("near", "far"), "y": ("near",), "z": ()}
    plan = storage.make_arg_plan({"a": "x", "b": "y", "c": "z"}, ["c"], providers.__getitem__)
    assert plan[0] == storage.ArgSpec("a", "x", ("near", "far"), False)
    assert s.fetch_args("c", plan) == {"a": "near-x", "b": "near-y"}
    assert s.fetch_args("c", ()) == {}
    s.inject_atom_args("c", {"x": "local"})
    assert s.fetch_args("c", plan)["a"] == "local"
    s.inject({"y": "store"})
    assert s.fetch_args("c", plan)["b"] == "store"
    required = storage.make_arg_plan({"c": "z"}, (), providers.__getitem__)
    with pytest.raises(exc.NotFound, match="'z'"):
        s.fetch_args("c", required)
    assert s.unsatisfied_args("c", required) == {"c"}
    assert s.unsatisfied_args("c", plan) == set()


def test_fast_path_skips_ignored_and_rejects_pending(s):
    s.ensure_atoms([Noop("near", provides="x"), Noop("far", provides="x"), Noop("c")])
    plan = storage.make_arg_plan({"a": "x"}, (), lambda sym: ("near", "far"))
    with pytest.raises(exc.NotFound):
        s.fetch_args("c", plan)  # near has not run yet
    s.set_atom_state("near", states.IGNORE)
    s.save("far", "far")
    assert s.fetch_args("c", plan) == {"a": "far"}


def test_progress_and_metadata(s):
    s.ensure_atoms([Noop("t"), retry.Times(name="r")])
    assert s.get_task_progress("t") == 0.0
    assert s.get_task_progress_details("t") is None
    s.set_task_progress("t", 0.5, details={"step": 1})
    assert s.get_task_progress("t") == 0.5
    assert s.get_task_progress_details("t") == {"at_progress": 0.5, "details": {"step": 1}}
    s.set_task_progress("t", 0.7, details={})
    assert s.get_task_progress_details("t") is None
    with pytest.raises(TypeError):
        s.set_task_progress("r", 0.5)
    s.update_atom_metadata("t", {"k": "v"})
    s.update_atom_metadata("t", [("k2", "v2")])
    assert s.get_task_progress("t") == 0.7  # metadata updates keep progress


def test_reset_keeps_injector(s):
    s.inject({"a": 1})
    s.reset(storage.Storage.injector_name)
    assert s.fetch("a") == 1


def test_reset_atoms(s):
    s.ensure_atoms([Noop("a"), Noop("b")])
    s.set_atom_state("a", states.SUCCESS)
    s.set_atom_intention("b", states.REVERT)
    s.reset_atoms(["a", "b"])
    assert s.get_atoms_states(["a", "b"]) == {
        "a": (states.PENDING, states.EXECUTE),
        "b": (states.PENDING, states.EXECUTE),
    }


def test_retry_history(s):
    s.ensure_atoms([retry.Times(3, name="r", provides="attempt"), Noop("t")])
    with pytest.raises(exc.StorageFailure):
        s.save_retry_failure("r", "t", _failure())
    s.save("r", 1)
    fail = _failure()
    s.save_retry_failure("r", "t", fail)
    s.save_retry_failure("r", "t", _failure("ignored: first one kept"))
    s.save("r", 2)
    history = s.get_retry_history("r")
    assert len(history) == 2
    assert list(history.outcomes_iter(0)) == [("t", fail)]
    assert history.failure is None
    assert s.fetch("attempt") == 2  # the latest attempt's result
    assert [name for name, _h in s.get_retry_histories()] == ["r"]
    s.cleanup_retry_history("r", states.PENDING)
    assert len(s.get_retry_history("r")) == 0
    with pytest.raises(TypeError):
        s.get_retry_history("t")


def test_flow_state_and_meta(s):
    assert s.get_flow_state() == states.PENDING
    assert s.change_flow_state(states.RUNNING) == (True, states.PENDING)
    assert s.get_flow_state() == states.RUNNING
    s.update_flow_metadata({"k": 1})
    assert s.flow_meta == {"k": 1}
    assert s.flow_name == "tmp-flow-detail"
    with pytest.raises(exc.InvalidState):
        s.change_flow_state(states.PENDING)


def test_default_backend_does_not_deep_copy(s):
    s.ensure_atom(Noop("t"))
    lock = threading.Lock()  # cannot be deep-copied; must still be storable
    s.save("t", lock)
    assert s.get("t") is lock
    assert isinstance(s.backend, impl_memory.MemoryBackend)


def test_loads_existing_flow_detail_with_injector():
    fd = models.FlowDetail("f", models.generate_uuid())
    s = storage.Storage(fd)
    s.inject({"a": 1})
    s2 = storage.Storage(fd)
    assert s2.fetch("a") == 1


def test_concurrent_readers_while_writing(s):
    names = [f"t{i}" for i in range(50)]
    s.ensure_atoms([Noop(n, provides=n + "_out") for n in names])
    stop = threading.Event()
    errors = []

    def reader():
        while not stop.is_set():
            try:
                s.fetch_all()
                s.get_atoms_states(names)
                s.get_execute_failures()
            except Exception as e:  # pragma: no cover - the test fails on it
                errors.append(e)
                return

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for n in names:
            s.set_atom_state(n, states.RUNNING)
            s.save(n, n)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
    assert errors == []
    assert s.fetch_all() == {n + "_out": n for n in names}
