"""Sphinx directives that print flowengine's own tables into the docs.

``.. flowengine-state-table:: module:callable``
    Calls ``callable()`` (an automaton machine factory, e.g.
    ``flowengine.engines.worker_based.protocol:build_a_machine``) at build
    time and renders its transitions as a table, so the docs can never
    disagree with the code.

``.. flowengine-json:: module:attribute.path``
    Renders a JSON-able value from the code (e.g. a message schema) as a
    JSON literal block.

A target that cannot be imported is a build warning (an error under ``-W``).
"""

from __future__ import annotations

import importlib
import json
import re

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOG = logging.getLogger(__name__)


# `*args` / `**kwargs` written bare in a docstring read as unclosed emphasis
# to docutils; escape such stars (outside ``literals``) instead of failing -W.
_BARE_STARS = re.compile(r"(?<![\\*\w])(\*\*?)(?=[A-Za-z_]\w*(?![\w*]))")


def _escape_unclosed(m: re.Match) -> str:
    # Leave real emphasis alone: a later `x*` (star after a non-space) closes it.
    if _CLOSING_STAR.search(m.string, m.end()):
        return m.group(1)
    return "\\*" * len(m.group(1))


_CLOSING_STAR = re.compile(r"[^\s*]\*+(?=[\s.,;:!?)'\"\]}-]|$)")


def _escape_bare_stars(app, what, name, obj, options, lines: list[str]) -> None:
    for i, line in enumerate(lines):
        if "*" not in line:
            continue
        parts = line.split("``")
        # Even-numbered parts are outside ``inline literals``.
        for j in range(0, len(parts), 2):
            parts[j] = _BARE_STARS.sub(_escape_unclosed, parts[j])
        lines[i] = "``".join(parts)


def _resolve(target: str):
    module_name, _, attr_path = target.partition(":")
    obj = importlib.import_module(module_name)
    for part in filter(None, attr_path.split(".")):
        obj = getattr(obj, part)
    return obj


def _table(header: list[str], rows: list[list[str]]) -> nodes.table:
    table = nodes.table(classes=["flowengine-generated"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    thead = nodes.thead()
    group += thead
    tbody = nodes.tbody()
    group += tbody
    for section, cells in ((thead, [header]), (tbody, rows)):
        for cells_row in cells:
            row = nodes.row()
            for cell in cells_row:
                entry = nodes.entry()
                entry += (
                    nodes.paragraph(text="")
                    if cell == ""
                    else nodes.paragraph("", "", nodes.literal(text=cell))
                )
                row += entry
            section += row
    return table


class _GeneratedDirective(SphinxDirective):
    required_arguments = 1
    has_content = False

    def _load(self):
        target = self.arguments[0]
        try:
            return _resolve(target)
        except Exception as exc:  # any import/attribute problem is reported, not raised
            LOG.warning(
                "cannot load %s for %s: %s", target, self.name, exc, location=self.get_location()
            )
            return None

    def _missing(self) -> list[nodes.Node]:
        return [nodes.paragraph(text=f"({self.arguments[0]} is not available in this build.)")]


class StateTableDirective(_GeneratedDirective):
    """Render an automaton machine's transitions as a table."""

    def run(self) -> list[nodes.Node]:
        factory = self._load()
        if factory is None:
            return self._missing()
        machine = factory() if callable(factory) else factory
        rows = [[start, event, end] for start, event, end in machine]
        out: list[nodes.Node] = [_table(["From state", "Event", "To state"], rows)]
        states = list(machine.states)
        # States with no way out (automaton keeps its terminal flag private).
        sources = {start for start, _event, _end in machine}
        terminal = [s for s in states if s not in sources]
        para = nodes.paragraph()
        para += nodes.Text("Start state: ")
        para += nodes.literal(text=str(machine.default_start_state))
        para += nodes.Text("; terminal states: ")
        for i, state in enumerate(terminal):
            if i:
                para += nodes.Text(", ")
            para += nodes.literal(text=state)
        para += nodes.Text(".")
        out.append(para)
        return out


class JsonDirective(_GeneratedDirective):
    """Render a JSON-able value from the code as a literal block."""

    def run(self) -> list[nodes.Node]:
        value = self._load()
        if value is None:
            return self._missing()
        text = json.dumps(value, indent=2, sort_keys=False, default=str)
        block = nodes.literal_block(text, text)
        block["language"] = "json"
        return [block]


def setup(app):
    app.add_directive("flowengine-state-table", StateTableDirective)
    app.add_directive("flowengine-json", JsonDirective)
    app.connect("autodoc-process-docstring", _escape_bare_stars)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
