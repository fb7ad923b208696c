"""Whether the process recorded as a flow's owner is still alive (flows resume's guard)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flowengine.persistence import process_owner


def test_this_process_is_alive():
    assert process_owner.is_alive(process_owner.this_process()) is True


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_a_process_that_exited_is_dead():
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    record = dict(process_owner.this_process(), pid=int(proc.stdout))
    assert process_owner.is_alive(record) is False


def test_a_reused_pid_is_not_the_recorded_process():
    # Given a record of this pid but with another start time (the pid was reused)
    record = process_owner.this_process()
    if record["start_ticks"] is None:
        pytest.skip("no /proc here: only the pid is recorded")
    record["start_ticks"] += 1
    assert process_owner.is_alive(record) is False


def test_a_record_from_before_a_reboot_is_dead():
    record = process_owner.this_process()
    if record["boot_id"] is None:
        pytest.skip("no boot id here")
    record["boot_id"] = "another-boot"
    assert process_owner.is_alive(record) is False


def test_another_host_cannot_be_told():
    record = dict(process_owner.this_process(), host="elsewhere.example")
    assert process_owner.is_alive(record) is None
    assert process_owner.describe(record) == f"pid {record['pid']} on host elsewhere.example"


def test_a_forked_child_records_itself_not_its_parent():
    import os

    parent = process_owner.this_process()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, str(process_owner.this_process()["pid"]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_pid = int(pipe.read())
    os.waitpid(pid, 0)
    assert child_pid == pid != parent["pid"]
