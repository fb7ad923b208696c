"""``flowengine flows list`` and ``show`` after successful, failed and reverted runs."""

from __future__ import annotations

import pytest

from tests.commands import ledger_flows
from tests.commands.flows_helpers import flowengine, listed, run_flow, saved_uuid, shown

# Out of the fast tier (tests/fast_tier.py): runs `flowengine` commands in processes of their own.
pytestmark = pytest.mark.broker


def _run_three(backend, tmp_path):
    """A successful flow (with a retry), a FAILURE and a REVERTED one: their uuids."""
    uuids = {}
    for factory, status in (("guarded", 0), ("failing", 1), ("reverting", 1)):
        proc = run_flow(backend, factory, tmp_path / f"{factory}.ledger")
        assert proc.returncode == status, proc.stderr
        uuids[factory] = saved_uuid(proc)
    return uuids


def test_list_shows_each_flow_with_state_times_and_atom_counts(flows_backend, tmp_path):
    # Given a successful, a failed and a reverted flow saved by `flowengine run`
    uuids = _run_three(flows_backend, tmp_path)
    # When the backend is listed as JSON
    books = listed(flows_backend)
    # Then the one logbook holds the three flows, newest first, with their states
    assert [b["name"] for b in books] == ["tests"]
    flows = books[0]["flows"]
    assert [f["name"] for f in flows] == ["reverting", "failing", "guarded"]
    assert {f["name"]: f["uuid"] for f in flows} == uuids
    by_name = {f["name"]: f for f in flows}
    assert by_name["guarded"]["state"] == "SUCCESS"
    assert by_name["guarded"]["atoms"] == {"SUCCESS": 3}
    assert by_name["failing"]["state"] == "FAILURE"
    assert by_name["failing"]["atoms"] == {"REVERTED": 1, "REVERT_FAILURE": 1}
    assert by_name["reverting"]["state"] == "REVERTED"
    assert by_name["reverting"]["atoms"] == {"REVERTED": 2}
    for f in flows:
        assert f["created_at"] <= f["updated_at"]
        assert f["factory"] == f"tests.commands.ledger_flows.{f['name']}"
    # And the human table has a row per flow naming its short uuid and state
    proc = flowengine("flows", "list", "--backend", flows_backend)
    assert proc.returncode == 0, proc.stderr
    rows = {
        line.split()[1]: line
        for line in proc.stdout.splitlines()
        if line.strip().startswith("tests ")
    }
    assert set(rows) == {u[:8] for u in uuids.values()}
    assert "SUCCESS" in rows[uuids["guarded"][:8]] and "3 SUCCESS" in rows[uuids["guarded"][:8]]
    assert "1 REVERTED, 1 REVERT_FAILURE" in rows[uuids["failing"][:8]]
    # And the filters keep what they name
    assert [f["name"] for b in listed(flows_backend, "--state", "failure") for f in b["flows"]] == [
        "failing"
    ]
    assert listed(flows_backend, "--book", "tests")[0]["name"] == "tests"
    proc = flowengine("flows", "list", "--backend", flows_backend, "--book", "nope")
    assert proc.returncode == 2 and "no logbook named 'nope'" in proc.stderr


def test_show_gives_atoms_in_order_results_failures_and_retry_history(flows_backend, tmp_path):
    uuids = _run_three(flows_backend, tmp_path)
    # A successful flow: atoms in execution order, the retry's two attempts
    ok = shown(flows_backend, uuids["guarded"][:6])
    assert ok["state"] == "SUCCESS" and ok["book"]["name"] == "tests"
    assert [(a["name"], a["type"], a["state"]) for a in ok["atoms"]] == [
        ("a", "task", "SUCCESS"),
        ("again", "retry", "SUCCESS"),
        ("wobbly", "task", "SUCCESS"),
    ]
    assert ok["atoms"][2]["result"] == "steady"
    history = ok["atoms"][1]["history"]
    assert len(history) == 2
    assert history[0]["failures"]["wobbly"]["message"] == "wobbly fails the first time"
    assert history[1]["failures"] == {}
    assert ok["injected"] == {"ledger": str(tmp_path / "guarded.ledger")}
    # A FAILURE: the execute failure and the failed revert, each with its traceback
    failed = shown(flows_backend, uuids["failing"])
    atoms = {a["name"]: a for a in failed["atoms"]}
    assert atoms["a"]["state"] == "REVERT_FAILURE"
    assert atoms["a"]["revert_failure"]["exc_type_names"][0] == "RuntimeError"
    assert "raise RuntimeError" in atoms["a"]["revert_failure"]["traceback"]
    assert atoms["flaky"]["failure"]["message"] == "flaky fails the first time"
    assert "ledger_flows.py" in atoms["flaky"]["failure"]["traceback"]
    # A REVERTED one: every atom reverted, the failure kept
    reverted = shown(flows_backend, uuids["reverting"])
    assert [(a["name"], a["state"], a["intention"]) for a in reverted["atoms"]] == [
        ("a", "REVERTED", "REVERT"),
        ("flaky", "REVERTED", "REVERT"),
    ]
    # And the human form says the same, traceback included
    proc = flowengine("flows", "show", uuids["failing"][:8], "--backend", flows_backend)
    assert proc.returncode == 0, proc.stderr
    assert "a (revert) failed: RuntimeError: cannot undo a" in proc.stdout
    assert "flaky (execute) failed: ValueError: flaky fails the first time" in proc.stdout
    assert 'raise ValueError(f"{self.name} fails the first time")' in proc.stdout
    proc = flowengine("flows", "show", uuids["guarded"], "--backend", flows_backend)
    assert "Retry again: 2 attempt(s)" in proc.stdout
    assert "1. result 1; failed: wobbly: ValueError: wobbly fails the first time" in proc.stdout


def test_show_cuts_long_results_unless_full(flows_backend, tmp_path):
    proc = run_flow(flows_backend, "steps", tmp_path / "ledger")
    assert proc.returncode == 0, proc.stderr
    uuid = saved_uuid(proc)
    text = "x" * ledger_flows.LONG_TEXT_CHARS
    short = flowengine("flows", "show", uuid, "--backend", flows_backend)
    assert short.returncode == 0, short.stderr
    assert text not in short.stdout and "xxxxxxxx…" in short.stdout
    full = flowengine("flows", "show", uuid, "--backend", flows_backend, "--full")
    assert text in full.stdout
    assert shown(flows_backend, uuid)["atoms"][3]["result"] == {"total": 3, "text": text}
