"""utils.gc_freeze: what exists is left alone by the collector during a block, then released."""

from __future__ import annotations

import gc
import weakref

from flowengine.utils import gc_freeze


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
