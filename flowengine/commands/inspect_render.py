"""Tables of ``flowengine inspect`` answers (rich), one layout per question."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _age(seconds: Any) -> str:
    if seconds is None:
        return "-"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _where(worker: dict[str, Any]) -> str:
    return f"{worker.get('hostname', '?')}:{worker.get('pid', '?')}"


def _topics(worker: dict[str, Any]) -> str:
    """The worker's topics, each whose consume loop keeps failing marked with why."""
    failing = worker.get("failing") or {}
    return ", ".join(
        f"{topic} (FAILING: {failing[topic]})" if topic in failing else topic
        for topic in worker.get("topics", [])
    )


def table(what: str, answers: Sequence[dict[str, Any]]) -> Any:
    """The rich Table showing ``answers`` to the question ``what``."""
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    if what in ("active", "reserved"):
        for col in (
            "WORKER",
            "TASK",
            "REQUEST",
            "ACTION",
            "ATTEMPT",
            "RUNNING FOR" if what == "active" else "WAITING FOR",
        ):
            t.add_column(col)
        for answer in answers:
            worker = answer["result"].get("worker", {})
            requests = answer["result"].get("requests", [])
            if not requests:
                t.add_row(answer["worker_id"], "(none)", "", "", "", "")
            for r in requests:
                age = r["running_for_s"] if what == "active" else r["held_for_s"]
                flag = " (cancelling)" if r.get("cancel_requested") else ""
                t.add_row(
                    worker.get("worker_id", answer["worker_id"]),
                    r["task"],
                    r["uuid"],
                    r["action"],
                    str(r["attempt"]),
                    _age(age) + flag,
                )
        return t
    if what == "stats":
        cols = (
            "WORKER",
            "HOST:PID",
            "TOPICS",
            "THREADS",
            "EXECUTOR",
            "UPTIME",
            "HELD",
            "RECEIVED",
            "SUCCEEDED",
            "FAILED",
            "CANCELLED",
            "RETRIED",
            "RECONNECTS",
            "DEAD-LETTERED",
        )
        for col in cols:
            t.add_column(col)
        for answer in answers:
            worker = answer["result"].get("worker", {})
            stats = answer["result"].get("stats", {})
            totals = stats.get("totals", {})
            t.add_row(
                answer["worker_id"],
                _where(worker),
                _topics(worker),
                str(worker.get("threads", "?")),
                str(worker.get("executor", "?")),
                _age(stats.get("uptime_s")),
                f"{worker.get('held', 0)} ({worker.get('running', 0)} running)",
                *(
                    str(totals.get(k, 0))
                    for k in ("received", "succeeded", "failed", "cancelled", "retried")
                ),
                str(stats.get("reconnects", 0)),
                str(stats.get("dead_lettered", 0)),
            )
        return t
    if what == "registered":
        for col in ("WORKER", "TOPICS", "TASKS"):
            t.add_column(col)
        for answer in answers:
            worker = answer["result"].get("worker", {})
            t.add_row(answer["worker_id"], _topics(worker), "\n".join(worker.get("tasks", [])))
        return t
    for col in ("WORKER", "HOST:PID", "TOPICS", "TASKS", "THREADS", "HELD", "RUNNING"):
        t.add_column(col)
    for answer in answers:
        worker = answer["result"].get("worker", {})
        t.add_row(
            answer["worker_id"],
            _where(worker),
            _topics(worker),
            str(len(worker.get("tasks", []))),
            str(worker.get("threads", "?")),
            str(worker.get("held", 0)),
            str(worker.get("running", 0)),
        )
    return t


def print_answers(what: str, answers: Sequence[dict[str, Any]]) -> None:
    """Print the table of ``answers`` on stdout (wide enough not to wrap ids)."""
    from rich.console import Console

    Console(width=200 if not _is_tty() else None).print(table(what, answers))


def _is_tty() -> bool:
    import sys

    return sys.stdout.isatty()
