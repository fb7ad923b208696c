"""Draw a compiled flow: DOT text (no dependency) or SVG/PNG through Graphviz's ``dot``.

Tasks are boxes, retry controllers diamonds, each (sub)flow a cluster whose
start and end are small points; edges are the execution graph's. Given
atom states (after a run), atoms are filled with the colour of their state.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from flowengine import flow as flow_mod
from flowengine import states as st
from flowengine.engines.action_engine import compiler

if TYPE_CHECKING:
    from flowengine.engines.action_engine.engine import ActionEngine

#: Seconds ``dot`` may take: large flows take about a second; this only
#: bounds a stuck process.
DOT_TIMEOUT_S = 60.0

#: Output formats rendered by ``dot``.
RENDERED_FORMATS = ("svg", "png", "pdf")

#: Extensions written as DOT text (no Graphviz needed).
DOT_FORMATS = ("dot", "gv")

#: Fill colour of an atom by state (light tints: the label stays readable).
STATE_COLOURS = {
    st.PENDING: "#ffffff",
    st.IGNORE: "#e0e0e0",
    st.RUNNING: "#fff3b0",
    st.SUCCESS: "#c8f2c2",
    st.FAILURE: "#f7b7b7",
    st.REVERTING: "#ffd8a8",
    st.REVERTED: "#d0d8ff",
    st.REVERT_FAILURE: "#e08080",
    st.RETRYING: "#f2d0f7",
}


#: The outline and label line of an atom whose own execution failed.
FAILED_OUTLINE = "#c62828"
FAILED_HERE = "\\nfailed here"

#: Atom name -> state (None: the atom has no state in storage yet).
AtomStates = Mapping[str, str | None]


class GraphvizMissing(RuntimeError):
    """Graphviz's ``dot`` program is needed for this output format and not installed."""


def dot_label(text: str) -> str:
    """A label quoted for DOT, keeping its own "\\n" line breaks: only quotes are escaped."""
    return '"' + text.replace('"', '\\"') + '"'


def _quote(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _compile(flow_or_compilation: flow_mod.Flow | compiler.Compilation) -> compiler.Compilation:
    if isinstance(flow_or_compilation, compiler.Compilation):
        return flow_or_compilation
    return compiler.PatternCompiler(flow_or_compilation).compile()


def to_dot(
    flow_or_compilation: flow_mod.Flow | compiler.Compilation,
    atom_states: AtomStates | None = None,
    title: str | None = None,
    failed_atoms: Collection[str] = (),
) -> str:
    """DOT text for a flow (or its Compilation), atoms coloured by ``atom_states``.

    ``failed_atoms``: atoms whose own execution failed, outlined in red and
    labelled so (once reverted, they are coloured like every reverted atom).
    """
    compilation = _compile(flow_or_compilation)
    graph = compilation.execution_graph
    kinds = {name: data["kind"] for name, data in graph.nodes(data=True)}
    members: dict[str | None, list[str]] = {}
    for node, kind in kinds.items():
        if kind == compilation.FLOW_END:
            parent = graph.nodes[node]["start"]
        elif kind == compilation.FLOW:
            parent = compilation.parent_flow(node)
        else:
            parent = compilation.parent_flow(node)
        members.setdefault(parent, []).append(node)
    ids = {node: f"n{i}" for i, node in enumerate(graph.nodes)}
    lines = [
        "digraph flow {",
        "  rankdir=TB;",
        "  compound=true;",
        '  fontname="Helvetica";',
        '  node [fontname="Helvetica", fontsize=11];',
        '  edge [color="#555555", arrowsize=0.7];',
    ]
    if title:
        lines.append(f"  label={_quote(title)}; labelloc=t;")

    def emit_cluster(flow_node: str, depth: int) -> None:
        pad = "  " * depth
        flow = graph.nodes[flow_node]["flow"]
        label = f"{flow.name} ({type(flow).__module__.rsplit('.', 1)[-1]})"
        retry = next((m for m in members.get(flow_node, ()) if kinds[m] == compilation.RETRY), None)
        if retry is not None:
            label += f" - retry: {retry}"
        lines.append(f"{pad}subgraph cluster_{ids[flow_node]} {{")
        lines.append(f'{pad}  label={_quote(label)}; style=rounded; color="#888888";')
        lines.append(f"{pad}  {ids[flow_node]} [shape=point, width=0.08];")
        lines.append(f"{pad}  {ids[graph.nodes[flow_node]['end']]} [shape=point, width=0.08];")
        for member in members.get(flow_node, ()):
            kind = kinds[member]
            if kind == compilation.FLOW:
                emit_cluster(member, depth + 1)
            elif kind in (compilation.TASK, compilation.RETRY):
                line = _atom_line(member, kind, compilation, atom_states, failed_atoms)
                lines.append(f"{pad}  {line}".replace("@ID@", ids[member]))
        lines.append(f"{pad}}}")

    for root in members.get(None, ()):
        if kinds[root] == compilation.FLOW:
            emit_cluster(root, 1)
        elif kinds[root] in (compilation.TASK, compilation.RETRY):
            lines.append(
                "  "
                + _atom_line(root, kinds[root], compilation, atom_states, failed_atoms).replace(
                    "@ID@", ids[root]
                )
            )
    for a, b, data in graph.edges(data=True):
        style = ' [style=dashed, label="decider"]' if data.get("decider") else ""
        lines.append(f"  {ids[a]} -> {ids[b]}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def failed_here(label: str) -> list[str]:
    """The DOT attributes of an atom whose own execution failed (``label`` completed)."""
    return [
        f"label={dot_label(label + FAILED_HERE)}",
        f"color={_quote(FAILED_OUTLINE)}",
        "penwidth=3",
    ]


def _atom_line(
    name: str,
    kind: str,
    compilation: compiler.Compilation,
    atom_states: AtomStates | None,
    failed_atoms: Collection[str] = (),
) -> str:
    atom = compilation.atoms[name]
    label = name
    cls = type(atom).__name__
    if cls != name:
        label += f"\\n{cls}"
    attrs = (
        ["shape=box", 'style="rounded,filled"']
        if kind == compilation.TASK
        else ["shape=diamond", "style=filled", "peripheries=2"]
    )
    state = (atom_states or {}).get(name)
    if state is not None:
        label += f"\\n[{state}]"
        attrs.append(f"fillcolor={_quote(STATE_COLOURS.get(state, '#ffffff'))}")
    else:
        attrs.append('fillcolor="#ffffff"' if kind == compilation.TASK else 'fillcolor="#f2d0f7"')
    if name in failed_atoms:
        return f"@ID@ [{', '.join(failed_here(label) + attrs)}];"
    return f"@ID@ [label={dot_label(label)}, {', '.join(attrs)}];"


def dot_program() -> str | None:
    """Path of Graphviz's ``dot`` program (None when not installed)."""
    return shutil.which("dot")


def render(dot_text: str, fmt: str) -> bytes:
    """Render DOT text to ``fmt`` (svg/png/pdf) with ``dot``; GraphvizMissing without it."""
    program = dot_program()
    if program is None:
        raise GraphvizMissing(
            f"Rendering {fmt} needs Graphviz's 'dot' program (Debian:"
            f" apt-get install graphviz); DOT text works without it"
        )
    proc = subprocess.run(
        [program, f"-T{fmt}"],
        input=dot_text.encode(),
        capture_output=True,
        timeout=DOT_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"dot failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[:500]}"
        )
    return proc.stdout


def write(
    flow_or_compilation: flow_mod.Flow | compiler.Compilation,
    path: str,
    atom_states: AtomStates | None = None,
    title: str | None = None,
) -> str:
    """Write the drawing to ``path``; its extension picks the format. Returns the format."""
    fmt = os.path.splitext(path)[1].lstrip(".").lower() or "dot"
    if fmt not in (*RENDERED_FORMATS, *DOT_FORMATS):
        # Writing DOT text under another extension would make a file that
        # neither a viewer nor Graphviz can open: refuse before writing.
        raise ValueError(
            f"cannot write {path!r}: the extension {fmt!r} is not a format"
            f" flowengine draws; use one of"
            f" {', '.join('.' + f for f in (*RENDERED_FORMATS, *DOT_FORMATS))}"
        )
    text = to_dot(flow_or_compilation, atom_states, title)
    if fmt in RENDERED_FORMATS:
        data = render(text, fmt)
        with open(path, "wb") as binary_out:
            binary_out.write(data)
        return fmt
    with open(path, "w", encoding="utf-8") as text_out:
        text_out.write(text)
    return "dot"


def engine_states(engine: ActionEngine) -> dict[str, str | None]:
    """Atom name -> state, read from an engine's storage (after or during a run)."""
    storage = engine.storage
    compilation = engine.compilation
    names = compilation.atoms if compilation is not None else ()
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = storage.get_atom_state(name)
        except Exception:  # not in storage yet (never prepared)
            continue
    return found


def draw_engine(engine: ActionEngine, path: str | None = None, states: bool = True) -> str:
    """DOT text of an engine's compiled flow (compiling it if needed), also written to ``path``."""
    engine.compile()
    compilation = engine.compilation
    # compile() either raises or leaves the engine compiled.
    assert compilation is not None
    atom_states = engine_states(engine) if states else None
    title = getattr(engine.storage, "flow_name", None)
    if path is not None:
        write(compilation, path, atom_states, title)
    return to_dot(compilation, atom_states, title)
