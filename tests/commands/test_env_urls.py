"""Server URLs from the environment: a password kept out of the process list."""

from __future__ import annotations

import pytest

from flowengine import cli
from flowengine.commands import env_urls
from flowengine.jobs import backends


def _board_with_a_job(tmp_path) -> str:
    url = f"sqlite:///{tmp_path}/jobs.db"
    board = backends.fetch("env", {"board": url})
    board.connect()
    try:
        board.post("from-the-environment", details={})
    finally:
        board.close()
    return url


def test_jobs_list_reads_the_board_from_the_environment(tmp_path, monkeypatch, capsys):
    # Given a board named only by $FLOWENGINE_BOARD
    monkeypatch.setenv(env_urls.BOARD_ENV, _board_with_a_job(tmp_path))
    # When jobs are listed without --board
    code = cli.main(["jobs", "list", "--board-name", "env"])
    # Then the board of the environment is the one listed
    assert code == 0
    assert "from-the-environment" in capsys.readouterr().out


def test_the_command_line_wins_over_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(env_urls.BOARD_ENV, f"sqlite:///{tmp_path}/empty.db")
    code = cli.main(["jobs", "list", "--board-name", "env", "--board", _board_with_a_job(tmp_path)])
    assert code == 0
    assert "from-the-environment" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, missing",
    [
        (["jobs", "list"], "--board (or $FLOWENGINE_BOARD)"),
        (["conductor", "--board", "sqlite:///x.db"], "--persistence (or $FLOWENGINE_PERSISTENCE)"),
        (
            ["jobs", "post", "m:f", "--board", "sqlite:///x.db"],
            "--persistence (or $FLOWENGINE_PERSISTENCE)",
        ),
    ],
)
def test_a_url_in_neither_place_is_a_usage_error(monkeypatch, capsys, argv, missing):
    for env in (env_urls.BOARD_ENV, env_urls.PERSISTENCE_ENV):
        monkeypatch.delenv(env, raising=False)
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert f"the following arguments are required: {missing}" in capsys.readouterr().err


def test_the_broker_url_comes_from_the_environment_unless_a_transport_is_named(monkeypatch):
    # Given $FLOWENGINE_BROKER_URL holding a password
    monkeypatch.setenv(env_urls.BROKER_ENV, "redis://:s3cret@127.0.0.1:1/0")
    parser = cli._build_parser()
    # Then a worker, an engine run and the live commands take it when given no broker
    for argv in (
        ["worker", "--exchange", "x", "--topic", "t", "--tasks", "m"],
        ["run", "m:f", "--engine", "worker-based"],
        ["inspect", "stats"],
    ):
        args = parser.parse_args(argv)
        assert env_urls.fill(args) is None
        assert args.url == "redis://:s3cret@127.0.0.1:1/0", argv
    # And neither a --transport nor the demo's own transport is overridden by it
    args = parser.parse_args(["inspect", "stats", "--transport", "filesystem"])
    env_urls.fill(args)
    assert args.url is None
    args = parser.parse_args(["demo"])
    env_urls.fill(args)
    assert args.url is None
