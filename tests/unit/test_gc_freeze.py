"""utils.gc_freeze: what exists is left alone by the collector during a block, then released."""

from __future__ import annotations

import gc
import weakref

import pytest

from flowengine.utils import gc_freeze


@pytest.fixture(autouse=True)
def tuning_allowed():
    """These tests are about what the blocks do when the process allows them."""
    was = gc_freeze.tuning_allowed()
    gc_freeze.allow_tuning(True)
    yield
    gc_freeze.allow_tuning(was)


class _Node:
    """Something that can be part of a reference cycle and be watched by a weakref."""

    def __init__(self) -> None:
        self.other: _Node | None = None


def test_nested_blocks_release_the_heap_when_the_outer_one_ends():
    assert gc.get_freeze_count() == 0
    with gc_freeze.frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with gc_freeze.frozen_heap():
            pass
        # The inner block ending does not release what the outer one froze
        # (releasing empties the permanent generation; the count may still
        # drop a little as frozen objects are freed by other threads).
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_a_cycle_made_garbage_inside_is_collected_after_the_block():
    # Given a reference cycle that exists before the block
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    watch = weakref.ref(a)
    with gc_freeze.frozen_heap():
        # When it becomes garbage inside the block
        del a, b
        gc.collect()
        # Then the collector leaves it alone while the heap is frozen
        assert watch() is not None
    # And collects it once the block is over.
    gc.collect()
    assert watch() is None


def test_objects_made_inside_the_block_are_collected_as_usual():
    with gc_freeze.frozen_heap():
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        watch = weakref.ref(a)
        del a, b
        gc.collect()
        assert watch() is None


def test_paused_collector_is_back_on_after_nested_blocks():
    assert gc.isenabled()
    with gc_freeze.collector_paused():
        assert not gc.isenabled()
        with gc_freeze.collector_paused():
            assert not gc.isenabled()
        # The inner block ending leaves the collector off for the outer one.
        assert not gc.isenabled()
    assert gc.isenabled()


def test_paused_collector_stays_off_when_the_caller_turned_it_off():
    gc.disable()
    try:
        with gc_freeze.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_collector_back_on_after_an_error_in_the_block():
    try:
        with gc_freeze.collector_paused():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.isenabled()


def test_graph_flow_add_leaves_the_collector_on():
    from flowengine.patterns import graph_flow
    from flowengine.task import Task

    class Provider(Task):
        def execute(self) -> int:
            return 1

    flow = graph_flow.Flow("f").add(Provider("a", provides="x"))
    assert gc.isenabled()
    assert len(flow) == 1


def test_without_the_process_allowing_it_the_blocks_leave_the_collector_alone():
    gc_freeze.allow_tuning(False)
    gc.freeze()  # the host's own frozen objects
    try:
        before = gc.get_freeze_count()
        with gc_freeze.frozen_heap(), gc_freeze.collector_paused():
            assert gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() >= before // 2 > 0
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("allowed", [False, True])
def test_compiling_a_flow_pauses_the_collector_only_where_allowed(monkeypatch, allowed):
    from flowengine import engines, task
    from flowengine.patterns import linear_flow

    class Nothing(task.Task):
        def execute(self):
            pass

    gc_freeze.allow_tuning(allowed)
    turned_off: list[bool] = []
    monkeypatch.setattr(gc, "disable", lambda: turned_off.append(True))
    engines.load(linear_flow.Flow("f").add(Nothing("a"), Nothing("b"))).compile()
    assert turned_off == ([True] if allowed else [])
