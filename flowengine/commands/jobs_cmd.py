"""``flowengine jobs post|list|show|wait|trash|requeue``: a jobboard from the shell.

``list`` shows the jobs on the board, or with ``--dead`` / ``--trash`` /
``--finished`` the dead-lettered, trashed, or consumed ones (the latter
newest first, while the board keeps their outcome).

``post`` saves a flow factory and its inputs to persistence and posts a job
naming them (conductors rebuild the flow from the factory); ``wait`` blocks
on the board's notifications until the job has an outcome; exit codes: 0
succeeded, 1 any other outcome, 124 timeout. ``--json`` prints one JSON
document and nothing else on stdout. Job details are shown masked
(secrets as ``***``) unless ``--board-option mask_details=none``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

#: Exit code of ``jobs wait`` when the timeout passes first (as timeout(1)).
EXIT_TIMEOUT = 124
#: Who ``jobs trash`` claims a job as before trashing it.
CLI_OWNER = "flowengine-cli"


def add_parser(sub: Any, parse_option: Any) -> None:
    """Add ``jobs`` and its subcommands to the ``flowengine`` parser."""
    p = sub.add_parser("jobs", help="post, list, show, wait for, trash or requeue jobs")
    jobs = p.add_subparsers(dest="jobs_command", required=True)

    def common(name: str, help_text: str) -> argparse.ArgumentParser:
        q: argparse.ArgumentParser = jobs.add_parser(name, help=help_text)
        q.add_argument(
            "--board", default=None, metavar="URL", help="jobboard URL (default: $FLOWENGINE_BOARD)"
        )
        q.set_defaults(needs_urls=("board",))
        q.add_argument("--board-name", default="flowengine", help="jobboard name")
        q.add_argument(
            "--board-option",
            dest="board_options",
            default=[],
            action="append",
            type=parse_option,
            metavar="KEY=VALUE",
            help="jobboard option",
        )
        q.add_argument("--json", action="store_true", help="print JSON only")
        return q

    post = common("post", "save a flow factory's inputs and post a job running it")
    post.add_argument(
        "factory",
        metavar="module:factory",
        help="a function returning the flow (importable by conductors)",
    )
    post.add_argument(
        "--persistence",
        default=None,
        metavar="URL",
        help="persistence URL (the conductors' --persistence; default: $FLOWENGINE_PERSISTENCE)",
    )
    post.set_defaults(needs_urls=("board", "persistence"))
    post.add_argument("--name", default=None, help="job name (default: the flow's)")
    post.add_argument(
        "--book",
        default=None,
        metavar="NAME",
        help="logbook to save the flow in, created if missing (name or uuid;"
        " default: the job's name): one logbook for the jobs of a kind",
    )
    post.add_argument(
        "--store",
        default=[],
        action="append",
        type=parse_option,
        metavar="KEY=VALUE",
        help="flow input (repeatable; JSON values)",
    )
    post.add_argument(
        "--store-json", default=None, metavar="JSON", help="flow inputs as one JSON object"
    )
    post.add_argument(
        "--priority", default="NORMAL", help="VERY_HIGH, HIGH, NORMAL, LOW or VERY_LOW"
    )
    post.add_argument("--engine", default=None, help="engine for this job")
    post.add_argument(
        "--engine-option",
        dest="engine_options",
        default=[],
        action="append",
        type=parse_option,
        metavar="KEY=VALUE",
        help="engine option for this job",
    )
    post.add_argument("--wait", action="store_true", help="then wait for its outcome")
    post.add_argument("--timeout", type=float, default=None, help="bound on --wait, seconds")
    listing = common("list", "list the jobs on the board (or dead-lettered, trashed, finished)")
    where = listing.add_mutually_exclusive_group()
    where.add_argument("--dead", action="store_true", help="the dead letter")
    where.add_argument("--trash", action="store_true", help="the trash")
    where.add_argument(
        "--finished",
        action="store_true",
        help="consumed jobs whose outcome the board still keeps, newest first",
    )
    listing.add_argument(
        "--limit",
        type=_count,
        default=None,
        metavar="N",
        help="with --finished: at most N jobs (default 100)",
    )
    common("show", "one job: posting, claim, attempts, outcome").add_argument(
        "uuid", help="job uuid or its first characters"
    )
    wait = common("wait", "wait (without polling) for a job's outcome")
    wait.add_argument("uuid")
    wait.add_argument("--timeout", type=float, default=None, help="seconds")
    trash = common("trash", "move an unclaimed job to the trash")
    trash.add_argument("uuid")
    trash.add_argument("--reason", default="trashed by hand", help="recorded with the outcome")
    common("requeue", "post a dead-lettered or trashed job again").add_argument("uuid")


def _count(text: str) -> int:
    """A ``--limit``: a whole number, 0 or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


@contextlib.contextmanager
def _board(args: argparse.Namespace, persistence: Any = None) -> Iterator[Any]:
    from flowengine.jobs import backends

    conf = {"board": args.board, **dict(args.board_options)}
    with backends.backend(args.board_name, conf, persistence=persistence) as board:
        yield board


def describe(board: Any, job: Any, outcome: Any = None) -> dict[str, Any]:
    """A job as `jobs show/list --json` print it (the dashboard lists the same).

    ``outcome``: the job's, when the caller read it already (else read now).
    """
    rec = job.record
    if outcome is None:
        outcome, state = board.outcome(job), board.job_state(job)
    else:  # read with the job: it left the board
        state = "COMPLETE"
    return {
        "uuid": job.uuid,
        "name": job.name,
        "priority": job.priority.value,
        "sequence": job.sequence,
        "where": rec.where,
        "state": state,
        "owner": rec.owner if rec.leased else None,
        "token": rec.token,
        "attempts": rec.attempts,
        "lease_expires_at": rec.lease_expires_at,
        "not_before": rec.not_before,
        "created_on": rec.posting.get("created_on"),
        "book": rec.posting.get("book"),
        "details": board.masked(job.details),
        "outcome": outcome.to_dict() if outcome is not None else None,
    }


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    # default=str: a posting TaskFlow wrote (compat='taskflow') may carry
    # datetimes, UUIDs or sets in its details (msgpack has them, JSON not).
    print(json.dumps(data, indent=2, sort_keys=True, default=str) if args.json else text)


def _find(board: Any, ref: str) -> Any:
    """The job ``ref`` names: its uuid, or the first characters of one (as flows accept).

    Prefixes are looked up among the jobs listed, dead-lettered and trashed;
    a prefix several share is refused naming them.
    """
    from flowengine import exceptions as exc
    from flowengine.commands.errors import CommandError

    try:
        return board.get_job(ref)
    except exc.NotFound:
        matches = {
            j.uuid: j
            for j in (*board.listing(), *board.dead_letters(), *board.trashed())
            if j.uuid.startswith(ref)
        }
        if len(matches) == 1:
            return next(iter(matches.values()))
        if matches:
            raise CommandError(
                f"{len(matches)} jobs start with {ref!r}: {', '.join(sorted(matches))}"
            ) from None
        raise


def _when(value: Any) -> str:
    """A time as people read it: ISO 8601 UTC (epoch seconds converted), '-' if none."""
    import datetime

    if value in (None, "", 0):
        return "-"
    if isinstance(value, (int, float)):
        return datetime.datetime.fromtimestamp(value, datetime.UTC).isoformat(timespec="seconds")
    return str(value)


def _show_text(data: dict[str, Any]) -> str:
    """``jobs show`` for a person: one field a line, plain words, no Python reprs."""
    book = data.get("book") or {}
    outcome = data.get("outcome")
    rows = [
        ("Job", data["uuid"]),
        ("Name", data["name"]),
        ("State", data["state"]),
        ("Priority", data["priority"]),
        ("Attempts", data["attempts"]),
        ("Owner", data["owner"] or "-"),
        ("Created", _when(data["created_on"])),
        ("Lease until", _when(data["lease_expires_at"])),
        ("Not before", _when(data["not_before"])),
        ("Logbook", f"{book.get('name')} ({book.get('uuid')})" if book else "-"),
        ("Details", json.dumps(data["details"], sort_keys=True, default=str)),
    ]
    if outcome is not None:
        rows.append(
            (
                "Outcome",
                f"{outcome['outcome']} by {outcome.get('who') or '-'} at"
                f" {_when(outcome.get('at'))}"
                + (f": {outcome['reason']}" if outcome.get("reason") else ""),
            )
        )
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)


def _list_text(rows: list[dict[str, Any]]) -> str:
    return _table(
        ("UUID", "STATE", "ATTEMPTS", "NAME", "OWNER"),
        [(r["uuid"], r["state"], str(r["attempts"]), r["name"], r["owner"] or "-") for r in rows],
    )


def _finished_text(rows: list[dict[str, Any]]) -> str:
    """``jobs list --finished`` for a person: how, when and by whom each job ended."""
    lines = []
    for r in rows:
        done = r["outcome"]
        lines.append(
            (
                r["uuid"],
                done["outcome"],
                _when(done.get("at")),
                str(done["attempts"]),
                r["name"],
                done.get("who") or "-",
                done.get("reason") or "-",
            )
        )
    return _table(("UUID", "OUTCOME", "FINISHED", "ATTEMPTS", "NAME", "WHO", "REASON"), lines)


def _table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    """Columns left-aligned under ``header``, two spaces apart."""
    widths = [max(len(x) for x in column) for column in zip(header, *lines)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in (header, *lines)
    )


def _wait(args: argparse.Namespace, board: Any, uuid: str) -> int:
    found = board.wait_for_outcome(uuid, args.timeout)
    if found is None:
        board.get_job(uuid)  # NotFound: unknown, or finished so long ago it is forgotten
        print(f"flowengine jobs: job {uuid} has no outcome after {args.timeout} s", file=sys.stderr)
        return EXIT_TIMEOUT
    _print(
        args,
        found.to_dict(),
        f"{uuid} {found.outcome}" + (f" ({found.reason})" if found.reason else ""),
    )
    return 0 if found.outcome == "succeeded" else 1


def _post(args: argparse.Namespace) -> int:
    from flowengine import engines
    from flowengine.commands import loading
    from flowengine.commands.flows import lookup
    from flowengine.persistence import backends as persistence
    from flowengine.persistence import run_records
    from flowengine.utils import persistence_utils as p_utils

    module, sep, attr = args.factory.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"expected module:factory, got {args.factory!r}")
    loading.make_cwd_importable()
    factory = f"{module}.{attr}"
    store = dict(args.store)
    if args.store_json:
        store.update(json.loads(args.store_json))
    flow = loading.load_flow(args.factory)
    with persistence.backend(args.persistence) as backend:
        book = lookup.book_to_fill(backend, args.book or args.name or flow.name)
        records = {"created_at": run_records.now(), "cwd": os.getcwd()}
        flow_detail = p_utils.create_flow_detail(
            flow, book=book, backend=backend, meta={run_records.META_KEY: records}
        )
        engines.save_factory_details(flow_detail, factory, [], {}, backend=backend)
        details: dict[str, Any] = {"flow_uuid": flow_detail.uuid, "store": store}
        if args.engine:
            details["engine"] = args.engine
        if args.engine_options:
            details["engine_options"] = dict(args.engine_options)
        with _board(args, persistence=backend) as board:
            job = board.post(args.name or flow.name, book, details=details, priority=args.priority)
            if not args.wait:
                _print(args, {"uuid": job.uuid}, job.uuid)
                return 0
            print(job.uuid, file=sys.stderr)
            return _wait(args, board, job.uuid)


def _list(args: argparse.Namespace, board: Any) -> int:
    if args.limit is not None and not args.finished:
        from flowengine.commands.errors import CommandError

        raise CommandError("--limit applies to --finished only")
    if args.finished:
        from flowengine.jobs.board import FINISHED_LIMIT

        found = board.finished(FINISHED_LIMIT if args.limit is None else args.limit)
        rows = [describe(board, job, done) for job, done in found]
    else:
        jobs = (
            board.dead_letters()
            if args.dead
            else board.trashed()
            if args.trash
            else board.listing()
        )
        rows = [describe(board, j) for j in jobs]
    if not rows and not args.json:
        if args.finished:
            print(
                "No finished jobs kept on this board: a consumed job is kept for the"
                " board's outcome_ttl_s after it ends (jobs TaskFlow's own conductors"
                " consume are not kept).",
                file=sys.stderr,
            )
            return 0
        where = "dead letter" if args.dead else "trash" if args.trash else "board"
        print(
            f"No jobs in the {where}. Finished jobs leave the listing; --finished lists"
            f" them while their outcome is kept (and --dead / --trash the jobs parked"
            f" there).",
            file=sys.stderr,
        )
        return 0
    _print(args, rows, _finished_text(rows) if args.finished else _list_text(rows))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``flowengine jobs <subcommand>``; returns the exit code."""
    command = args.jobs_command
    if command == "post":
        return _post(args)
    with _board(args) as board:
        if command == "list":
            return _list(args, board)
        if command == "show":
            data = describe(board, _find(board, args.uuid))
            _print(args, data, _show_text(data))
            return 0
        if command == "wait":
            return _wait(args, board, args.uuid)
        if command == "trash":
            job = board.get_job(args.uuid)
            board.claim(job, CLI_OWNER)
            board.trash(job, CLI_OWNER, reason=args.reason)
            _print(args, {"uuid": job.uuid, "outcome": "trashed"}, f"{job.uuid} trashed")
            return 0
        job = board.requeue(args.uuid)
        _print(args, {"uuid": job.uuid}, f"{job.uuid} requeued")
        return 0
