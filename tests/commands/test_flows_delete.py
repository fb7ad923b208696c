"""``flowengine flows delete``: a flow or a logbook, after confirmation."""

from __future__ import annotations

import pytest

from tests.commands.flows_helpers import flowengine, ledger, listed, run_flow, saved_uuid

# Out of the fast tier (tests/fast_tier.py): runs `flowengine` commands in processes of their own.
pytestmark = pytest.mark.broker


def _two_flows(backend, tmp_path, book="tests"):
    return [
        saved_uuid(run_flow(backend, "steps", tmp_path / f"ledger-{i}", book=book))
        for i in range(2)
    ]


def test_delete_asks_first_and_does_nothing_without_a_yes(flows_backend, tmp_path):
    # Given two saved flows
    gone, kept = _two_flows(flows_backend, tmp_path)
    # When deleting one is answered "n" (and then with no answer at all)
    no = flowengine("flows", "delete", gone[:8], "--backend", flows_backend, stdin="n\n")
    eof = flowengine("flows", "delete", gone[:8], "--backend", flows_backend, stdin="")
    # Then it asked, naming the flow, and deleted nothing
    for proc in (no, eof):
        assert proc.returncode == 1
        assert (
            f"Delete flow {gone} 'steps' (SUCCESS, 4 SUCCESS) from logbook 'tests'?" in proc.stderr
        )
        assert "nothing deleted" in proc.stderr
    assert {f["uuid"] for f in listed(flows_backend)[0]["flows"]} == {gone, kept}
    # When it is answered "y"
    yes = flowengine("flows", "delete", gone[:8], "--backend", flows_backend, stdin="y\n")
    # Then that flow is gone, the other and the logbook stay
    assert yes.returncode == 0, yes.stderr
    assert yes.stdout.startswith(f"Deleted flow {gone} 'steps'")
    (book,) = listed(flows_backend)
    assert [f["uuid"] for f in book["flows"]] == [kept]
    show = flowengine("flows", "show", gone, "--backend", flows_backend)
    assert show.returncode == 2 and f"no flow detail '{gone}'" in show.stderr


def test_delete_a_logbook_with_yes(flows_backend, tmp_path):
    # Given two logbooks
    _two_flows(flows_backend, tmp_path, book="old")
    (other,) = [saved_uuid(run_flow(flows_backend, "steps", tmp_path / "l", book="new"))]
    # When one is deleted with --yes
    proc = flowengine("flows", "delete", "--book", "old", "--yes", "--backend", flows_backend)
    # Then it and its flows are gone without a question; the other stays
    assert proc.returncode == 0, proc.stderr
    assert "[y/N]" not in proc.stderr
    assert "Deleted logbook 'old' (" in proc.stdout and "and its 2 flow(s)" in proc.stdout
    assert [(b["name"], [f["uuid"] for f in b["flows"]]) for b in listed(flows_backend)] == [
        ("new", [other])
    ]


def test_delete_refuses_a_running_flow_unless_forced(tmp_path):
    # Given a flow left RUNNING by an engine killed mid-flow
    from tests.commands.test_flows_resume import _killed_mid_flow

    backend = f"dir:{tmp_path}/store"
    uuid, _pid = _killed_mid_flow(backend, tmp_path / "ledger")
    # When it is deleted without --force, even with --yes
    refused = flowengine("flows", "delete", uuid, "--yes", "--backend", backend)
    # Then it is refused in one line
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"flowengine flows delete: refusing to delete a flow that may still be running:"
        f" {uuid[:8]} 'steps' (RUNNING); pass --force if its engine is dead"
    )
    # And --force deletes it
    forced = flowengine("flows", "delete", uuid, "--yes", "--force", "--backend", backend)
    assert forced.returncode == 0, forced.stderr
    assert listed(backend)[0]["flows"] == []
    assert ledger(tmp_path / "ledger") == ["a", "b"]
