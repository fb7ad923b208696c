"""``flowengine flows retry``: a FAILURE or REVERTED flow runs again from the start."""

from __future__ import annotations

import json

import pytest

from tests.commands.flows_helpers import flowengine, ledger, run_flow, saved_uuid, shown

# Out of the fast tier (tests/fast_tier.py): runs `flowengine` commands in processes of their own.
pytestmark = pytest.mark.broker


@pytest.mark.parametrize(
    "factory, first_state, first_run",
    [
        # a's revert fails too: FAILURE, which TaskFlow's engine would not reset
        ("failing", "FAILURE", ["a", "flaky", "revert flaky", "revert a"]),
        # a clean revert: REVERTED, which the engine resets itself (as TaskFlow's)
        ("reverting", "REVERTED", ["a", "flaky", "revert flaky", "revert a"]),
    ],
)
def test_retry_runs_a_failed_flow_again_and_it_succeeds(
    flows_backend, tmp_path, factory, first_state, first_run
):
    # Given a flow whose task failed on its first run
    path = tmp_path / "ledger"
    proc = run_flow(flows_backend, factory, path)
    assert proc.returncode == 1, proc.stderr
    uuid = saved_uuid(proc)
    assert shown(flows_backend, uuid)["state"] == first_state
    assert ledger(path) == first_run
    # When it is retried
    retry = flowengine("flows", "retry", uuid[:8], "--backend", flows_backend, "--no-progress")
    # Then every task ran again from the start, and this time the flow succeeded
    assert retry.returncode == 0, retry.stderr
    assert ledger(path) == first_run + ["a", "flaky"]
    assert json.loads(retry.stdout) == {"ledger": str(path), "x": 1}
    flow = shown(flows_backend, uuid)
    assert flow["state"] == "SUCCESS"
    assert [(a["name"], a["state"], a["intention"], a["failure"]) for a in flow["atoms"]] == [
        ("a", "SUCCESS", "EXECUTE", None),
        ("flaky", "SUCCESS", "EXECUTE", None),
    ]
    # And what the discarded attempt ended with is kept for `flows show`
    (attempt,) = flow["retries"]
    assert attempt["state"] == first_state
    assert attempt["failures"]["flaky"] == "ValueError: flaky fails the first time"
    assert ("a" in attempt["failures"]) == (first_state == "FAILURE")
    human = flowengine("flows", "show", uuid, "--backend", flows_backend)
    assert "Discarded by retry 1 (" in human.stdout and f"): {first_state};" in human.stdout
    # And a flow that succeeded is not retried
    again = flowengine("flows", "retry", uuid, "--backend", flows_backend)
    assert again.returncode == 2 and "already SUCCESS: nothing to retry" in again.stderr
    assert ledger(path) == first_run + ["a", "flaky"]


def test_a_retry_that_fails_again_keeps_both_discarded_attempts(tmp_path):
    # Given a REVERTED flow (its second task failed once)
    backend = f"sqlite:///{tmp_path}/flows.db"
    path = tmp_path / "ledger"
    uuid = saved_uuid(run_flow(backend, "reverting", path))
    first_run = path.read_text()
    # When a retry fails in another way: the ledger cannot be written, so the first
    # task fails, and so does its revert (FAILURE)
    path.unlink()
    path.mkdir()
    second = flowengine("flows", "retry", uuid, "--backend", backend, "--no-progress")
    assert second.returncode == 1
    assert "flowengine flows retry: task 'a' failed: IsADirectoryError" in second.stderr
    assert shown(backend, uuid)["state"] == "FAILURE"
    # And the ledger is back for a third run
    path.rmdir()
    path.write_text(first_run)
    third = flowengine("flows", "retry", uuid, "--backend", backend, "--no-progress")
    # Then the third run succeeds and both discarded attempts are listed, oldest first
    assert third.returncode == 0, third.stderr
    flow = shown(backend, uuid)
    assert flow["state"] == "SUCCESS"
    assert [r["state"] for r in flow["retries"]] == ["REVERTED", "FAILURE"]
    assert flow["retries"][1]["failures"]["a"].startswith("IsADirectoryError")
