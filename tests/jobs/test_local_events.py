"""Datagram events between the processes of one host (jobs/backends/local_events.py)."""

from __future__ import annotations

import os

from flowengine.jobs.backends import local_events


def test_a_listener_receives_what_is_sent_and_the_last_one_removes_the_directory(tmp_path):
    # Given two listeners of one board
    directory = local_events.directory_for(str(tmp_path / "board.db"), "ns")
    first, second = local_events.listen(directory), local_events.listen(directory)
    try:
        # When an event is sent, each receives it
        local_events.send(directory, b"posted")
        assert local_events.receive(first) == [b"posted"]
        assert local_events.receive(second) == [b"posted"]
        # and when one shuts, the directory stays for the other
        local_events.shut(first)
        assert os.listdir(directory) == [os.path.basename(second.getsockname())]
    finally:
        local_events.shut(second)
    # Then the last one to shut leaves nothing behind
    assert not os.path.exists(directory)


def test_a_listener_binds_although_the_last_one_removes_the_directory_meanwhile(
    tmp_path, monkeypatch
):
    # Given a directory that is gone again right after it is made (the last
    # listener shutting between this listener's makedirs and bind),
    directory = local_events.directory_for(str(tmp_path / "board.db"), "ns")
    makedirs = os.makedirs
    made: list[str] = []

    def made_then_removed(path, *args, **kwargs):
        makedirs(path, *args, **kwargs)
        made.append(path)
        if len(made) == 1:
            os.rmdir(path)

    monkeypatch.setattr(local_events.os, "makedirs", made_then_removed)
    # when a listener binds there,
    sock = local_events.listen(directory)
    try:
        # then it made the directory again and is bound in it
        assert made == [directory, directory]
        assert os.path.dirname(sock.getsockname()) == directory
        local_events.send(directory, b"x")
        assert local_events.receive(sock) == [b"x"]
    finally:
        local_events.shut(sock)
