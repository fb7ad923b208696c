"""``flowengine flows resume`` after the engine process was killed with SIGKILL mid-flow."""

from __future__ import annotations

import json

import pytest

from tests.commands.flows_helpers import (
    FLOWS_MODULE,
    Background,
    flowengine,
    ledger,
    listed,
    saved_uuid,
    shown,
)
from tests.worker_based.executor_helpers import unique

# Out of the fast tier (tests/fast_tier.py): runs `flowengine` commands in processes of their own.
pytestmark = pytest.mark.broker


def _killed_mid_flow(backend, ledger_path, *engine_args):
    """`flowengine run --backend` killed with SIGKILL while task b runs: (uuid, its pid)."""
    run = Background(
        "run",
        f"{FLOWS_MODULE}:steps",
        "--backend",
        backend,
        "--book",
        "crash",
        "--store",
        f"ledger={ledger_path}",
        "--store",
        "block=b",
        "--no-progress",
        *engine_args,
    )
    try:
        uuid = run.wait_for("flowengine run: flow ").split()[3]
        run.wait_for("BLOCKED b")
        run.kill9()
    finally:
        run.close()
    return uuid, run.proc.pid


def test_resume_after_kill_9_runs_only_what_had_not_finished(flows_backend, tmp_path):
    # Given a flow whose engine was killed while b ran (a had finished)
    path = tmp_path / "ledger"
    uuid, killed_pid = _killed_mid_flow(flows_backend, path)
    assert ledger(path) == ["a", "b"]
    flow = shown(flows_backend, uuid)
    assert flow["state"] == "RUNNING"
    assert [(a["name"], a["state"]) for a in flow["atoms"]] == [
        ("a", "SUCCESS"),
        ("b", "RUNNING"),
        ("c", "PENDING"),
        ("report", "PENDING"),
    ]
    # When it is resumed from the command line, by a prefix of its uuid
    proc = flowengine("flows", "resume", uuid[:8], "--backend", flows_backend, "--no-progress")
    # Then a did not run again, b ran again, c and report ran once
    assert proc.returncode == 0, proc.stderr
    assert ledger(path) == ["a", "b", "b", "c", "report"]
    assert json.loads(proc.stdout)["total"] == 3
    flow = shown(flows_backend, uuid)
    assert flow["state"] == "SUCCESS"
    assert {a["state"] for a in flow["atoms"]} == {"SUCCESS"}
    assert flow["owner"]["pid"] not in (None, killed_pid)  # the resuming process took over
    # And a SUCCESS flow is not resumed again
    again = flowengine("flows", "resume", uuid, "--backend", flows_backend)
    assert again.returncode == 2
    assert again.stderr.strip() == (
        f"flowengine flows resume: flow {uuid[:8]} 'steps' is already SUCCESS: nothing to resume"
    )
    assert ledger(path) == ["a", "b", "b", "c", "report"]


def test_resume_refuses_a_flow_whose_engine_is_alive(tmp_path):
    backend = f"sqlite:///{tmp_path}/flows.db"
    path = tmp_path / "ledger"
    # Given an engine process blocked in task b
    run = Background(
        "run",
        f"{FLOWS_MODULE}:steps",
        "--backend",
        backend,
        "--store",
        f"ledger={path}",
        "--store",
        "block=b",
        "--no-progress",
    )
    try:
        uuid = run.wait_for("flowengine run: flow ").split()[3]
        run.wait_for("BLOCKED b")
        # When resume, retry and delete are asked for while it lives
        resume = flowengine("flows", "resume", uuid, "--backend", backend)
        retry = flowengine("flows", "retry", uuid, "--backend", backend)
        delete = flowengine("flows", "delete", uuid, "--backend", backend, "--yes")
    finally:
        run.close()
    # Then each refuses in one line, and nothing ran twice
    assert resume.returncode == 2
    assert f"is RUNNING in pid {run.proc.pid} on host" in resume.stderr
    assert "still alive" in resume.stderr and len(resume.stderr.splitlines()) == 1
    assert retry.returncode == 2 and "it has not ended" in retry.stderr
    assert delete.returncode == 2 and "pass --force if its engine is dead" in delete.stderr
    assert ledger(path) == ["a", "b"]
    assert listed(backend)[0]["flows"][0]["uuid"] == uuid


def test_resume_refuses_a_flow_without_a_factory(tmp_path):
    backend = f"dir:{tmp_path}/store"
    # Given a flow saved from a flow object (no factory to rebuild it with)
    proc = flowengine(
        "run",
        f"{FLOWS_MODULE}:FLOW_OBJECT",
        "--backend",
        backend,
        "--store",
        f"ledger={tmp_path}/ledger",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    assert "is a flow object, not a factory" in proc.stderr
    uuid = saved_uuid(proc)
    _mark_running_by_a_dead_process(backend, uuid)
    # When it is resumed
    resume = flowengine("flows", "resume", uuid, "--backend", backend, "--force")
    # Then the refusal says why and what to do instead
    assert resume.returncode == 2
    assert "records no flow factory" in resume.stderr
    assert "engines.load(flow, flow_detail=" in resume.stderr


def test_resume_names_the_directory_a_factory_was_imported_from(tmp_path):
    # Given a flow run from a module of the current directory, left RUNNING
    project = tmp_path / "project"
    project.mkdir()
    (project / "localflows.py").write_text(
        "from tests.commands.ledger_flows import steps\n\n\ndef make():\n    return steps()\n"
    )
    backend = f"sqlite:///{tmp_path}/flows.db"
    proc = flowengine(
        "run",
        "localflows:make",
        "--backend",
        backend,
        "--no-progress",
        "--store",
        f"ledger={tmp_path}/ledger",
        cwd=project,
    )
    assert proc.returncode == 0, proc.stderr
    uuid = saved_uuid(proc)
    _mark_running_by_a_dead_process(backend, uuid)
    # When it is resumed from another directory, where that module is not found
    elsewhere = flowengine("flows", "resume", uuid, "--backend", backend, "--force")
    # Then the message names the import that failed and where the module was
    assert elsewhere.returncode == 2
    assert elsewhere.stderr.startswith(
        f"flowengine flows resume: cannot rebuild flow {uuid[:8]}: Could not import factory"
        f" 'localflows.make': No module named 'localflows'"
    )
    assert f"it was imported from {project}: run from there" in elsewhere.stderr
    # And from that directory it resumes
    there = flowengine(
        "flows", "resume", uuid, "--backend", backend, "--force", "--no-progress", cwd=project
    )
    assert there.returncode == 0, there.stderr


def _mark_running_by_a_dead_process(backend, uuid):
    """Make the stored flow look as if its engine died while running it."""
    import contextlib

    from flowengine.commands import backend_url

    url = backend_url.parse_url(backend)
    with backend_url.opened(url) as be, contextlib.closing(be.get_connection()) as conn:
        fd = conn.get_flow_details(uuid)
        fd.state = "RUNNING"
        conn.update_flow_details(fd)


def test_resume_on_the_worker_based_engine_after_kill_9(tmp_path):
    # Given a worker process serving the ledger tasks over the filesystem transport
    backend = f"sqlite:///{tmp_path}/flows.db"
    path = tmp_path / "ledger"
    bus = tmp_path / "bus"
    bus.mkdir()
    broker = [
        "--exchange",
        unique(),
        "--topic",
        "t",
        "--transport",
        "filesystem",
        "--transport-option",
        f"data_folder={bus}",
    ]
    worker = Background("worker", *broker, "--tasks", FLOWS_MODULE, "--threads", "4")
    try:
        worker.wait_for("serves topic")
        # And a worker-based engine killed while the worker runs its task b
        uuid = _killed_worker_based(backend, path, worker, broker)
        assert ledger(path) == ["a", "b"]
        assert shown(backend, uuid)["engine"] == "worker-based"
        # When the flow is resumed on the worker-based engine
        proc = flowengine(
            "flows",
            "resume",
            uuid,
            "--backend",
            backend,
            "--no-progress",
            "--engine",
            "worker-based",
            *broker,
        )
        # Then only the unfinished tasks ran again, on the worker
        assert proc.returncode == 0, proc.stderr
        assert ledger(path) == ["a", "b", "b", "c", "report"]
        assert shown(backend, uuid)["state"] == "SUCCESS"
        assert "attempts 1" in proc.stderr  # remote timings: they ran on the worker
        # And `flows show` says where and how long each task of the resumed run took
        runs = {a["name"]: a["run"] for a in shown(backend, uuid)["atoms"]}
        assert "serves topic" in worker.wait_for(f"Worker {runs['c']['worker']} ")  # its id
        assert runs["c"]["duration_s"] >= 0 and runs["c"]["ended_at"] >= runs["c"]["started_at"]
    finally:
        # b's first execution is still blocked in the worker: no warm shutdown.
        worker.close()


def _killed_worker_based(backend, path, worker, broker):
    """`flowengine run --engine worker-based --backend` killed while task b runs remotely."""
    run = Background(
        "run",
        f"{FLOWS_MODULE}:steps",
        "--backend",
        backend,
        "--store",
        f"ledger={path}",
        "--store",
        "block=b",
        "--no-progress",
        "--engine",
        "worker-based",
        *broker,
    )
    try:
        uuid = run.wait_for("flowengine run: flow ").split()[3]
        worker.wait_for("BLOCKED b")  # inside the worker process
        run.kill9()
    finally:
        run.close()
    return uuid
