"""Tests for decider depths."""

import pytest

from flowengine import deciders as de


def test_translate():
    assert de.Depth.translate("all") is de.Depth.ALL
    assert de.Depth.translate("Neighbors") is de.Depth.NEIGHBORS
    assert de.Depth.translate(de.Depth.ATOM) is de.Depth.ATOM
    assert de.Depth.FLOW == "FLOW"
    with pytest.raises(ValueError) as info:
        de.Depth.translate("everything")
    assert "everything" in str(info.value)
    with pytest.raises(TypeError):
        de.Depth.translate(3)


def test_pick_widest():
    assert de.pick_widest([de.Depth.ATOM, de.Depth.FLOW]) is de.Depth.FLOW
    assert de.pick_widest(["atom", "neighbors"]) is de.Depth.NEIGHBORS
    assert de.pick_widest([de.Depth.ATOM, de.Depth.ALL, "flow"]) is de.Depth.ALL
    assert de.pick_widest([de.Depth.ATOM]) is de.Depth.ATOM
    with pytest.raises(ValueError):
        de.pick_widest([])
