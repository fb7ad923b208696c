"""Human output of ``flows list`` and ``flows show`` (rich tables, states in colour)."""

from __future__ import annotations

import datetime
import sys
from typing import Any

from flowengine import states as st
from flowengine.commands.flows import lookup, settings, views
from flowengine.persistence import process_owner, run_records

#: Width used when stdout is not a terminal (a pipe, a file): wide enough
#: that a table line is never cut or folded for grep and diff.
PIPE_WIDTH_COLUMNS = 200
#: ... and with ``--full``, whose results must reach a pipe whole, unwrapped.
FULL_PIPE_WIDTH_COLUMNS = 100_000

#: Colour of each state (any other state is shown plain).
STATE_STYLES = {
    st.SUCCESS: "green",
    st.FAILURE: "bold red",
    st.REVERT_FAILURE: "bold red",
    st.REVERTED: "magenta",
    st.REVERTING: "magenta",
    st.RUNNING: "yellow",
    st.SUSPENDED: "cyan",
    st.SUSPENDING: "cyan",
    st.RESUMING: "cyan",
    st.RETRYING: "yellow",
    st.PENDING: "dim",
    st.IGNORE: "dim",
}


def _console(whole_lines: bool = False) -> Any:
    """A console for stdout; ``whole_lines``: piped output never wraps (``--full``)."""
    from rich.console import Console

    piped = FULL_PIPE_WIDTH_COLUMNS if whole_lines else PIPE_WIDTH_COLUMNS
    width = None if sys.stdout.isatty() else piped
    return Console(width=width, highlight=False, soft_wrap=False)


def _state(state: str | None) -> Any:
    from rich.text import Text

    state = state or st.PENDING
    return Text(state, style=STATE_STYLES.get(state, ""))


def when(moment: datetime.datetime | None) -> str:
    """A time in the local timezone to the second, or '-' when unknown."""
    if moment is None:
        return "-"
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def counts_text(counts: dict[str, int]) -> str:
    """``3 SUCCESS, 1 RUNNING`` (or ``no atoms``)."""
    return ", ".join(f"{n} {state}" for state, n in counts.items()) or "no atoms"


def flows_table(books: list[tuple[Any, list[Any]]], safe_url: str) -> None:
    """One row per flow detail (and per empty logbook)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    console = _console()
    if not books:
        console.print(Text(f"No flows in {safe_url}."))
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in ("LOGBOOK", "FLOW", "NAME", "STATE", "CREATED", "UPDATED", "ATOMS"):
        table.add_column(column, no_wrap=column != "ATOMS")
    for book, fds in books:
        book_cell = Text(book.name)
        if not fds:
            table.add_row(book_cell, "-", Text("(no flows)", style="dim"), "", "", "", "")
        for fd in fds:
            created, updated = views.times(fd)
            table.add_row(
                book_cell,
                lookup.short(fd.uuid),
                Text(fd.name),
                _state(fd.state),
                when(created),
                when(updated),
                counts_text(views.atom_counts(fd)),
            )
    console.print(table)


def _line(console: Any, label: str, value: Any) -> None:
    from rich.text import Text

    text = Text(f"{label:<10}", style="bold")
    text.append(value if isinstance(value, Text) else Text(str(value)))
    console.print(text)


def show(book: Any, fd: Any, full: bool, reveal: bool = False) -> None:
    """A flow detail: header, its atoms in order, then failures and retry histories."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    console = _console(whole_lines=full)
    records = run_records.of(fd)
    created, updated = views.times(fd)
    _line(console, "Flow", f"{fd.name} ({fd.uuid})")
    _line(console, "Logbook", f"{book.name} ({book.uuid})" if book is not None else "-")
    _line(console, "State", _state(fd.state))
    _line(console, "Created", when(created))
    _line(console, "Updated", when(updated))
    factory = fd.meta.get("factory") if isinstance(fd.meta, dict) else None
    _line(
        console,
        "Factory",
        _factory_text(factory)
        if factory
        else "- (none recorded: `flows resume` and `retry` cannot rebuild it)",
    )
    if records.get("engine"):
        _line(console, "Engine", records["engine"])
    if fd.state in settings.IN_PROGRESS_STATES and isinstance(records.get("owner"), dict):
        _line(console, "Owner", process_owner.describe(records["owner"]))
    injected = views.injected(fd, reveal)
    if injected:
        _line(console, "Injected", views.summarize(injected, full))
    atoms = views.atoms_in_order(fd)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    shown = [views.atom_view(ad, fd) for ad in atoms]
    # Where each ran matters only for remote atoms: no empty column otherwise.
    remote_atoms = any(view["run"].get("worker") for view in shown)
    columns = (
        "#",
        "ATOM",
        "TYPE",
        "STATE",
        "INTENTION",
        "TOOK",
        *(("WORKER",) if remote_atoms else ()),
        "RESULT",
    )
    for column in columns:
        table.add_column(
            column,
            no_wrap=column != "RESULT" or not full,
            justify="right" if column in ("#", "TOOK") else "left",
        )
    for i, (ad, view) in enumerate(zip(atoms, shown), 1):
        took = view["run"].get("duration_s")
        worker_cell = (Text(view["run"].get("worker") or "-"),) if remote_atoms else ()
        table.add_row(
            str(i),
            Text(ad.name),
            view["type"],
            _state(view["state"]),
            ad.intention,
            "-" if took is None else f"{took:.3f} s",
            *worker_cell,
            Text(_result_text(view, full)),
        )
    console.print(table)
    remote = records.get("engine") == "worker-based"
    for ad, view in zip(atoms, shown):
        for key, action in (("failure", "execute"), ("revert_failure", "revert")):
            if view[key] is not None:
                where = "the worker's" if remote and view["type"] == "task" else "local"
                _failure(console, f"{ad.name} ({action}) failed", view[key], where)
        if view["type"] == "retry" and view["history"]:
            _history(console, ad.name, view["history"], full)
    for n, attempt in enumerate(records.get("retries") or (), 1):
        failures = (
            "; ".join(f"{name}: {text}" for name, text in (attempt.get("failures") or {}).items())
            or "no failure stored"
        )
        at = when(run_records.parse_time(attempt.get("at")))
        console.print(Text(f"Discarded by retry {n} ({at}): {attempt.get('state')}; {failures}"))


def _factory_text(factory: dict[str, Any]) -> str:
    args = factory.get("args") or []
    kwargs = factory.get("kwargs") or {}
    extra = f" args {views.summarize(args)}" if args else ""
    extra += f" kwargs {views.summarize(kwargs)}" if kwargs else ""
    return f"{factory.get('name')}{extra}"


def _result_text(view: dict[str, Any], full: bool) -> str:
    if view["type"] == "retry":
        return f"{len(view['history'])} attempt(s)"
    if view["state"] in (st.REVERTED, st.REVERT_FAILURE) and view["revert_result"] is not None:
        return "reverted: " + views.summarize(view["revert_result"], full)
    if view["failure"] is not None and view["result"] is None:
        return "-"
    if view["state"] in (st.PENDING, st.RUNNING) and view["result"] is None:
        return ""
    return views.summarize(view["result"], full)


def _failure(console: Any, title: str, failure: dict[str, Any], where: str) -> None:
    from rich.text import Text

    kind = failure["exc_type_names"][0] if failure["exc_type_names"] else "Exception"
    console.print()
    console.print(Text(f"{title}: {kind}: {failure['message']}", style="bold red"))
    if failure["traceback"]:
        console.print(Text(f"  traceback ({where}):", style="dim"))
        for line in failure["traceback"].rstrip().splitlines():
            console.print(Text("  " + line))
    for cause in failure["causes"]:
        cause_kind = cause["exc_type_names"][0] if cause["exc_type_names"] else "Exception"
        console.print(Text(f"  caused by {cause_kind}: {cause['message']}"))


def _history(console: Any, name: str, history: list[dict[str, Any]], full: bool) -> None:
    from rich.text import Text

    console.print()
    console.print(Text(f"Retry {name}: {len(history)} attempt(s)", style="bold"))
    for n, attempt in enumerate(history, 1):
        failures = ", ".join(
            f"{atom}: {f['exc_type_names'][0] if f['exc_type_names'] else ''}: {f['message']}"
            for atom, f in attempt["failures"].items()
        )
        console.print(
            Text(
                f"  {n}. result {views.summarize(attempt['result'], full)}"
                + (f"; failed: {failures}" if failures else "")
            )
        )
