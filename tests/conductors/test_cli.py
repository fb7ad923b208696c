"""``flowengine jobs ...`` and ``flowengine conductor`` as a user runs them (Redis board)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.conductors import fleet  # noqa: E402
from tests.jobs.boards import Boards  # noqa: E402

pytestmark = [pytest.mark.broker, pytest.mark.slow]
#: Bound on one CLI command (a cold start plus a round trip or two).
COMMAND_TIMEOUT_S = 60


@pytest.fixture
def cli(redis_url, tmp_path):
    board = Boards("redis", redis_url).url
    persistence = f"sqlite:///{tmp_path}/flows.db"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p),
    )

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "flowengine", "jobs", args[0], "--board", board, *args[1:]]
        if args[0] == "post":
            cmd += ["--persistence", persistence]
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=env,
            cwd=str(tmp_path),
            timeout=COMMAND_TIMEOUT_S,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{cmd} exited {proc.returncode}: {proc.stderr}")
        return proc

    run.board, run.persistence, run.tmp, run.env = board, persistence, str(tmp_path), env
    return run


def _fleet(cli, **board_options) -> fleet.Fleet:
    extra = [a for k, v in board_options.items() for a in ("--board-option", f"{k}={v}")]
    return fleet.Fleet(cli.tmp, cli.board, cli.persistence, 2.0, extra=extra)


def test_post_list_show_then_a_conductor_runs_it(cli):
    ledger = os.path.join(cli.tmp, "ledger.jsonl")
    # Given a job posted from the shell, with a secret among its inputs
    posted = cli(
        "post",
        "tests.conductors.ledger_flows:chain_factory",
        "--store",
        f"ledger={json.dumps(ledger)}",
        "--store",
        "job=j1",
        "--store",
        'api_token="s3cret"',
        "--json",
    )
    uuid = json.loads(posted.stdout)["uuid"]
    listed = json.loads(cli("list", "--json").stdout)
    assert [j["uuid"] for j in listed] == [uuid] and listed[0]["state"] == "UNCLAIMED"
    assert "s3cret" not in cli("show", uuid).stdout  # masked
    # And a person reads them: a header over the listing, a job found by its
    # first characters, fields in plain words (no Python reprs, no raw epoch)
    table = cli("list").stdout.splitlines()
    assert table[0].split() == ["UUID", "STATE", "ATTEMPTS", "NAME", "OWNER"]
    assert table[1].startswith(uuid) and "UNCLAIMED" in table[1]
    shown = cli("show", uuid[:8]).stdout
    assert shown.splitlines()[0].split() == ["Job", uuid]
    assert "{'" not in shown and '"api_token": "***"' in shown
    # When a conductor runs
    conductors = _fleet(cli)
    try:
        conductors.start()
        waited = cli("wait", uuid, "--timeout", "60", "--json")
    finally:
        conductors.stop()
    # Then the poster's wait returns its outcome
    assert json.loads(waited.stdout)["outcome"] == "succeeded"
    shown = json.loads(cli("show", uuid, "--json").stdout)
    assert shown["state"] == "COMPLETE" and shown["outcome"]["who"] == "c1"
    assert cli("list", "--json").stdout.strip() == "[]"
    # And an empty listing says where finished jobs went
    empty = cli("list")
    assert empty.stdout == "" and "Finished jobs leave the listing" in empty.stderr
    outcome = [line for line in cli("show", uuid).stdout.splitlines() if line.startswith("Outcome")]
    assert len(outcome) == 1 and " succeeded by c1 at 20" in outcome[0]  # an ISO date
    # And the finished listing shows how, when and by whom it ended
    finished = cli("list", "--finished").stdout.splitlines()
    assert finished[0].split() == [
        "UUID",
        "OUTCOME",
        "FINISHED",
        "ATTEMPTS",
        "NAME",
        "WHO",
        "REASON",
    ]
    job_id, how, when, attempts, _name, who, reason = finished[1].split()
    assert (job_id, how, attempts, who, reason) == (uuid, "succeeded", "1", "c1", "-")
    assert when.startswith("20") and when.endswith("+00:00")  # ISO, UTC
    [row] = json.loads(cli("list", "--finished", "--json").stdout)
    assert row["uuid"] == uuid and row["where"] == "consumed"
    assert row["outcome"]["outcome"] == "succeeded" and row["outcome"]["who"] == "c1"


def test_a_conductors_flows_read_like_flowengine_runs(cli):
    # Given two jobs of one kind posted from the shell
    ledger = os.path.join(cli.tmp, "ledger.jsonl")
    uuids = [
        json.loads(
            cli(
                "post",
                "tests.conductors.ledger_flows:backwards_factory",
                "--store",
                f"ledger={json.dumps(ledger)}",
                "--store",
                f"job=b{i}",
                "--json",
            ).stdout
        )["uuid"]
        for i in range(2)
    ]
    # When a conductor runs them
    conductors = _fleet(cli)
    try:
        conductors.start()
        for uuid in uuids:
            cli("wait", uuid, "--timeout", "60")
    finally:
        conductors.stop()

    def flows(*args: str) -> Any:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "flowengine",
                "flows",
                *args,
                "--backend",
                cli.persistence,
                "--json",
            ],
            capture_output=True,
            text=True,
            env=cli.env,
            cwd=cli.tmp,
            timeout=COMMAND_TIMEOUT_S,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    # Then both flows are in one logbook named after the jobs, with their times
    # and engine as `flowengine run` records them, atoms in execution order
    [book] = flows("list")
    assert book["name"] == "backwards" and len(book["flows"]) == 2
    for flow in book["flows"]:
        assert flow["state"] == "SUCCESS" and flow["engine"] == "serial"
        assert flow["created_at"] and flow["updated_at"] >= flow["created_at"]
        atoms = flows("show", flow["uuid"])["atoms"]
        assert [a["name"] for a in atoms] == ["c", "b", "a"]
        assert all(a["run"]["duration_s"] >= 0 for a in atoms), atoms


def test_wait_times_out_with_124(cli):
    uuid = json.loads(cli("post", "tests.conductors.ledger_flows:short_factory", "--json").stdout)[
        "uuid"
    ]
    waited = cli("wait", uuid, "--timeout", "0.2", check=False)
    assert waited.returncode == 124 and "no outcome after 0.2 s" in waited.stderr


def test_trash_then_requeue(cli):
    uuid = cli("post", "tests.conductors.ledger_flows:short_factory").stdout.strip()
    cli("trash", uuid, "--reason", "wrong input")
    assert cli("wait", uuid, check=False).returncode == 1
    trashed = json.loads(cli("list", "--trash", "--json").stdout)
    assert [j["uuid"] for j in trashed] == [uuid]
    assert trashed[0]["outcome"]["reason"] == "wrong input"
    cli("requeue", uuid)
    assert [j["uuid"] for j in json.loads(cli("list", "--json").stdout)] == [uuid]


def test_a_poison_job_is_listed_dead_and_can_be_requeued(cli):
    ledger = os.path.join(cli.tmp, "ledger.jsonl")
    uuid = cli(
        "post",
        "tests.conductors.ledger_flows:poison_factory",
        "--store",
        f"ledger={json.dumps(ledger)}",
        "--store",
        "job=p",
    ).stdout.strip()
    conductors = _fleet(cli, max_attempts=1)
    try:
        conductors.start()
        conductors.start()  # dead-letters it once the first one died of it
        waited = cli("wait", uuid, "--timeout", "60", check=False)
    finally:
        conductors.stop()
    assert waited.returncode == 1 and waited.stdout.startswith(f"{uuid} dead")
    assert [j["uuid"] for j in json.loads(cli("list", "--dead", "--json").stdout)] == [uuid]
    cli("requeue", uuid)
    assert json.loads(cli("show", uuid, "--json").stdout)["attempts"] == 0


def test_mistakes_are_one_line(cli):
    bad = cli("post", "no_colon_here", check=False)
    assert bad.returncode == 1 and "expected module:factory" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    unknown = cli("show", "no-such-job", check=False)
    assert unknown.returncode == 1 and "No job no-such-job" in unknown.stderr
    board = subprocess.run(
        [sys.executable, "-m", "flowengine", "jobs", "list", "--board", "consul://127.0.0.1:1/"],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert board.returncode == 1 and "Could not find jobboard 'consul'" in board.stderr
