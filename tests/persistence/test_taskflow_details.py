"""What TaskFlow's and flowengine's engines persist, compared: same flows, memory backends.

Each flow runs once on TaskFlow 6.5 and once on flowengine, each with its
own memory backend; the logbook, flow detail and every atom detail read back
from the backend must have the same ``to_dict()`` keys, and each atom the
same state, intention and meta. Skipped without TaskFlow (the ``interop``
extra).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import pytest

pytest.importorskip("taskflow", reason="TaskFlow is not installed (pip install -e .[interop])")


def _lib(name: str, module: str) -> Any:
    return importlib.import_module(f"{name}.{module}")


def _tasks(lib: str) -> dict[str, type]:
    task = _lib(lib, "task")

    class Make(task.Task):
        default_provides = "x"

        def execute(self) -> int:
            return 2

    class Double(task.Task):
        def execute(self, x: int) -> int:
            return x * 2

    return {"Make": Make, "Double": Double}


def linear(lib: str) -> Any:
    lf = _lib(lib, "patterns.linear_flow")
    t = _tasks(lib)
    return lf.Flow("linear").add(t["Make"]("make"), t["Double"]("double", provides="y"))


def graph_ignoring_a_branch(lib: str) -> Any:
    gf = _lib(lib, "patterns.graph_flow")
    t = _tasks(lib)
    make = t["Make"]("make")
    kept = t["Double"]("kept", provides="kept_y")
    skipped = t["Double"]("skipped", provides="skipped_y")
    after = t["Double"]("after_skipped", provides="after_y", rebind={"x": "skipped_y"})
    flow = gf.Flow("graph").add(make, kept, skipped, after)
    flow.link(make, kept)
    flow.link(make, skipped, decider=lambda history: False)  # the branch is IGNOREd
    flow.link(skipped, after)
    return flow


def _run(lib: str, factory: Any) -> dict[str, Any]:
    """Run the flow on ``lib`` with a memory backend; what the backend holds afterwards."""
    engines = _lib(lib, "engines")
    impl_memory = _lib(lib, "persistence.backends.impl_memory")
    p_utils = _lib(lib, "utils.persistence_utils")
    backend = impl_memory.MemoryBackend()
    book, fd = p_utils.temporary_flow_detail(backend)
    engines.load(factory(lib), flow_detail=fd, book=book, backend=backend).run()
    with contextlib.closing(backend.get_connection()) as conn:
        stored_book = conn.get_logbook(book.uuid)
    stored_fd = stored_book.find(fd.uuid)
    return {"book": stored_book.to_dict(), "flow": stored_fd.to_dict(),
            "atoms": {ad.name: ad.to_dict() for ad in stored_fd}}


@pytest.mark.parametrize("factory", [linear, graph_ignoring_a_branch],
                         ids=["linear", "graph-ignoring-a-branch"])
def test_details_have_taskflows_keys_and_meta(factory):
    theirs, ours = _run("taskflow", factory), _run("flowengine", factory)
    assert sorted(ours["book"]) == sorted(theirs["book"])
    assert sorted(ours["flow"]) == sorted(theirs["flow"])
    assert (ours["flow"]["state"], ours["flow"]["meta"].keys()) == (
        theirs["flow"]["state"], theirs["flow"]["meta"].keys())
    assert sorted(ours["atoms"]) == sorted(theirs["atoms"])
    for name, theirs_atom in theirs["atoms"].items():
        ours_atom = ours["atoms"][name]
        assert sorted(ours_atom) == sorted(theirs_atom), name
        for key in ("state", "intention", "meta", "results"):
            assert ours_atom[key] == theirs_atom[key], (name, key)


def test_the_ignored_branch_is_ignored_on_both():
    for lib in ("taskflow", "flowengine"):
        atoms = _run(lib, graph_ignoring_a_branch)["atoms"]
        assert {n: a["state"] for n, a in atoms.items()} == {
            "make": "SUCCESS", "kept": "SUCCESS", "skipped": "IGNORE",
            "after_skipped": "IGNORE"}, lib
        assert atoms["skipped"]["meta"] == {"progress": 0.0}, lib
