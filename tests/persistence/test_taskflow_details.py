"""What TaskFlow's and flowengine's engines persist, compared: same flows, same backends.

Each flow runs once on TaskFlow 6.5 and once on flowengine, each with its
own backend of one kind (memory, dir, SQLite); the logbook, flow detail and
every atom detail read back from the backend must have the same
``to_dict()`` keys, and each atom the same state, intention, meta, results
and failures (tracebacks aside). The dir backend's files must hold the same
keys too. Skipped without TaskFlow (the ``interop`` extra).
"""

from __future__ import annotations

import contextlib
import importlib
import json
from pathlib import Path
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


def retried(lib: str) -> Any:
    """A task that fails once under a ``Times`` retry, then succeeds."""
    task, retry = _lib(lib, "task"), _lib(lib, "retry")
    lf = _lib(lib, "patterns.linear_flow")
    calls = []

    class FailsOnce(task.Task):
        def execute(self) -> int:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("first try fails")
            return len(calls)

    return lf.Flow("retried", retry=retry.Times(3, name="again")).add(
        FailsOnce("fails_once", provides="v")
    )


def reverted(lib: str) -> Any:
    """A task that always fails after one that succeeded: the flow reverts."""
    task, lf = _lib(lib, "task"), _lib(lib, "patterns.linear_flow")

    class Undoable(task.Task):
        default_provides = "x"

        def execute(self) -> int:
            return 1

        def revert(self, *args: Any, **kwargs: Any) -> str:
            return "undone"

    class Fails(task.Task):
        def execute(self) -> None:
            raise RuntimeError("boom")

    return lf.Flow("reverted").add(Undoable("undoable"), Fails("fails"))


FLOWS = [linear, graph_ignoring_a_branch, retried, reverted]
BACKENDS = ["memory", "dir", "sqlite"]


def _conf(kind: str, where: Path) -> dict[str, Any]:
    if kind == "memory":
        return {"connection": "memory"}
    if kind == "dir":
        return {"connection": "dir", "path": str(where)}
    return {"connection": f"sqlite:///{where}.sqlite"}


def _run(lib: str, factory: Any, kind: str = "memory", where: Path | None = None) -> dict[str, Any]:
    """Run the flow on ``lib`` with a ``kind`` backend; what the backend holds afterwards."""
    engines = _lib(lib, "engines")
    backends = _lib(lib, "persistence.backends")
    p_utils = _lib(lib, "utils.persistence_utils")
    backend = backends.fetch(_conf(kind, where or Path()))
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    book, fd = p_utils.temporary_flow_detail(backend)
    with contextlib.suppress(RuntimeError):  # the reverted flow re-raises its failure
        engines.load(factory(lib), flow_detail=fd, book=book, backend=backend).run()
    with contextlib.closing(backend.get_connection()) as conn:
        stored_book = conn.get_logbook(book.uuid)
    backend.close()
    stored_fd = stored_book.find(fd.uuid)
    return {
        "book": stored_book.to_dict(),
        "flow": stored_fd.to_dict(),
        "atoms": {ad.name: ad.to_dict() for ad in stored_fd},
    }


def _without_tracebacks(value: Any) -> Any:
    """``value`` with every failure's traceback text dropped (paths and lines differ)."""
    if isinstance(value, dict):
        return {k: _without_tracebacks(v) for k, v in value.items() if k != "traceback_str"}
    if isinstance(value, (list, tuple)):
        return [_without_tracebacks(v) for v in value]
    return value


def _retry_history(results: list[Any]) -> list[dict[str, Any]]:
    """A retry's history without its data: the failures of each attempt.

    TaskFlow 6.5's ``RetryDetail.from_dict`` replaces an attempt's data with
    the dict of the last failure of that attempt (its inner loop reuses the
    outer loop's variable name), so a history read back from any TaskFlow
    backend has no trustworthy data where an attempt failed; flowengine keeps
    the data (``test_a_retry_keeps_each_attempts_result``).
    """
    return [_without_tracebacks(failures) for _data, failures in results]


def _assert_same_records(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert sorted(ours["book"]) == sorted(theirs["book"])
    assert sorted(ours["flow"]) == sorted(theirs["flow"])
    assert (ours["flow"]["state"], ours["flow"]["meta"].keys()) == (
        theirs["flow"]["state"],
        theirs["flow"]["meta"].keys(),
    )
    assert sorted(ours["atoms"]) == sorted(theirs["atoms"])
    for name, theirs_atom in theirs["atoms"].items():
        ours_atom = ours["atoms"][name]
        assert sorted(ours_atom) == sorted(theirs_atom), name
        for key in ("state", "intention", "meta", "revert_results", "failure", "revert_failure"):
            assert _without_tracebacks(ours_atom[key]) == _without_tracebacks(theirs_atom[key]), (
                name,
                key,
            )
        if isinstance(theirs_atom["results"], list):  # a retry's history
            assert _retry_history(ours_atom["results"]) == _retry_history(theirs_atom["results"]), (
                name
            )
        else:
            assert ours_atom["results"] == theirs_atom["results"], name


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("factory", FLOWS, ids=[f.__name__ for f in FLOWS])
def test_details_have_taskflows_keys_and_meta(factory, kind, tmp_path):
    theirs = _run("taskflow", factory, kind, tmp_path / "taskflow")
    ours = _run("flowengine", factory, kind, tmp_path / "flowengine")
    _assert_same_records(ours, theirs)


def _json_shape(value: Any) -> Any:
    """The keys of ``value`` at every depth, values aside."""
    if isinstance(value, dict):
        return {k: _json_shape(v) for k, v in value.items()}
    return type(value).__name__ if value is None or isinstance(value, (bool, str)) else "value"


def _dir_documents(root: Path) -> dict[str, Any]:
    """Each JSON document the dir backend wrote, by kind, with its shape."""
    shapes: dict[str, Any] = {}
    for kind in ("books", "flow_details", "atom_details"):
        for metadata in sorted((root / kind).glob("*/metadata")):
            document = json.loads(metadata.read_text())
            name = document.get("name") or document["atom"]["name"]
            shapes[f"{kind}/{name}"] = _json_shape(_without_tracebacks(document))
    return shapes


@pytest.mark.parametrize("factory", FLOWS, ids=[f.__name__ for f in FLOWS])
def test_dir_backend_files_have_taskflows_keys(factory, tmp_path):
    _run("taskflow", factory, "dir", tmp_path / "taskflow")
    _run("flowengine", factory, "dir", tmp_path / "flowengine")
    theirs = _dir_documents(tmp_path / "taskflow")
    assert theirs, "TaskFlow wrote no documents: the test reads the wrong place"
    ours = _dir_documents(tmp_path / "flowengine")
    assert sorted(ours) == sorted(theirs)
    for name, shape in theirs.items():
        assert ours[name] == shape, name


def test_a_retry_keeps_each_attempts_result():
    atoms = _run("flowengine", retried)["atoms"]
    history = atoms["again"]["results"]
    assert [data for data, _failures in history] == [1, 2]
    assert [sorted(failures) for _data, failures in history] == [["fails_once"], []]


def test_the_ignored_branch_is_ignored_on_both():
    for lib in ("taskflow", "flowengine"):
        atoms = _run(lib, graph_ignoring_a_branch)["atoms"]
        assert {n: a["state"] for n, a in atoms.items()} == {
            "make": "SUCCESS",
            "kept": "SUCCESS",
            "skipped": "IGNORE",
            "after_skipped": "IGNORE",
        }, lib
        assert atoms["skipped"]["meta"] == {"progress": 0.0}, lib
