"""What the dashboard shows of persisted flows: lists, details, graphs coloured by state.

Read from a persistence backend (``--backend``, as ``flowengine flows``
takes it) on each request: the page always shows what is stored now. A
flow's graph is drawn from the flow its recorded factory rebuilds (the
current directory is importable, as for ``flows resume``); a flow without a
factory, or whose factory cannot be imported here, is drawn as its atoms in
execution order.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from flowengine import engines
from flowengine import flow as flow_mod
from flowengine.commands import backend_url, loading
from flowengine.commands.flows import lookup, views
from flowengine.dashboard.history import HistoryFilter
from flowengine.engines.action_engine import graph_draw

LOG = logging.getLogger(__name__)

#: Flows listed at most (the most recently active first).
MAX_FLOWS = 200


class FlowsSource:
    """Reads logbooks and flow details from the backend at ``url`` (a --backend URL).

    Raises CommandError (bad URL, missing store) and MissingExtra (SQL
    without its extra) when built.
    """

    def __init__(self, url: str) -> None:
        self.url = backend_url.parse_url(url)
        #: As given (a password included): only for the commands this dashboard
        #: starts (through their environment, never their command line).
        self.raw_url = url
        with backend_url.opened(self.url):
            pass  # fails now, naming the problem, rather than on every page
        loading.make_cwd_importable()

    @contextlib.contextmanager
    def _conn(self) -> Any:
        with (
            backend_url.opened(self.url) as backend,
            contextlib.closing(backend.get_connection()) as conn,
        ):
            yield conn

    def list(self, only: HistoryFilter | None = None) -> list[dict[str, Any]]:
        """The flows ``only`` matches (every one without), most recently active first.

        Each with its logbook's name and the workers its atoms last ran on.
        """
        rows = []
        with self._conn() as conn:
            for book in conn.get_logbooks(lazy=False):
                for fd in book:
                    if only is not None and not only.matches(fd):
                        continue
                    rows.append(
                        (
                            fd,
                            dict(
                                views.flow_view(fd),
                                book=book.name,
                                workers=sorted(views.workers_of(fd)),
                            ),
                        )
                    )
        ordered = views.newest_first([fd for fd, _ in rows])
        by_uuid = {fd.uuid: row for fd, row in rows}
        return [by_uuid[fd.uuid] for fd in ordered][:MAX_FLOWS]

    def detail(self, ref: str) -> dict[str, Any]:
        """One flow detail, whole (atoms, failures with tracebacks); CommandError if unknown."""
        with self._conn() as conn:
            book, fd = lookup.find_flow(conn, ref, self.url.safe)
            return views.show_view(book, fd)

    def find(self, ref: str) -> Any:
        """The flow detail ``ref`` names (a uuid or its first characters); CommandError if none."""
        with self._conn() as conn:
            return lookup.find_flow(conn, ref, self.url.safe)[1]

    def graph_dot(self, ref: str) -> str:
        """DOT text of the flow's graph, atoms coloured by their stored state."""
        with self._conn() as conn:
            _book, fd = lookup.find_flow(conn, ref, self.url.safe)
            states = {ad.name: ad.state for ad in fd}
            # Reverted, the atom that failed is coloured like the others:
            # outlined, it stands out (as "failed here" does in the atoms table).
            failed = {ad.name for ad in fd if getattr(ad, "failure", None) is not None}
            try:
                flow = engines.flow_from_detail(fd)
            except Exception as e:
                LOG.info("Flow %s drawn as a chain of its atoms: %s", fd.uuid, e)
                return _chain_dot(fd, states, failed)
            if not isinstance(flow, flow_mod.Flow):  # a lone task
                return _chain_dot(fd, states, failed)
            return graph_draw.to_dot(flow, states, title=fd.name, failed_atoms=failed)

    def graph_svg(self, ref: str) -> bytes:
        """The graph as SVG (GraphvizMissing without Graphviz's dot)."""
        return graph_draw.render(self.graph_dot(ref), "svg")


def _chain_dot(fd: Any, states: dict[str, Any], failed: set[str]) -> str:
    """A flow whose shape is unknown here: its atoms in execution order, coloured."""
    lines = [
        "digraph flow {",
        '  rankdir=TB; fontname="Helvetica";',
        f'  label="{fd.name} (atoms in execution order)"; labelloc=t;',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11];',
    ]
    atoms = [ad for ad in views.atoms_in_order(fd) if not views.is_injector(ad)]
    for i, ad in enumerate(atoms):
        state = states.get(ad.name)
        colour = graph_draw.STATE_COLOURS.get(state or "", "#ffffff")
        label = f"{ad.name}\\n[{state}]"
        if ad.name in failed:
            attrs = ", ".join(graph_draw.failed_here(label))
            lines.append(f'  a{i} [{attrs}, fillcolor="{colour}"];')
        else:
            lines.append(f'  a{i} [label={graph_draw.dot_label(label)}, fillcolor="{colour}"];')
    lines.extend(f"  a{i} -> a{i + 1};" for i in range(len(atoms) - 1))
    lines.append("}")
    return "\n".join(lines) + "\n"
