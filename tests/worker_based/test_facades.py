"""protocol.py and events.py are facades over small modules: they must stay faithful.

Each facade re-exports names defined elsewhere. Its documented constants
repeat the defining module's ``#:`` comment (the API docs read it from the
facade), and its private aliases are what tests reach the fast paths and
the decoder through: both must stay the defining modules' own.
"""

from __future__ import annotations

import ast
import inspect
from types import ModuleType

import pytest

from flowengine.engines.worker_based import (
    event_channel,
    event_format,
    event_publisher,
    event_receiver,
    events,
    protocol,
    request_machine,
    wire_failures,
    wire_messages,
    wire_names,
    wire_request,
    wire_schemas,
)

PARTS = {
    protocol: (wire_names, request_machine, wire_schemas, wire_failures, wire_messages,
               wire_request),
    events: (event_format, event_channel, event_publisher, event_receiver),
}


def doc_comments(module: ModuleType) -> dict[str, str]:
    """Module-level ``#:`` comments, by the name assigned right below them."""
    lines = inspect.getsource(module).splitlines()
    found = {}
    for node in ast.parse("\n".join(lines)).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        above = []
        row = node.lineno - 2  # the line above the assignment, 0-based
        while row >= 0 and lines[row].lstrip().startswith("#:"):
            above.insert(0, lines[row].strip()[2:].strip())
            row -= 1
        if above:
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = " ".join(above)
    return found


@pytest.mark.parametrize("facade", list(PARTS), ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_facade_doc_comments_match_the_defining_module(facade):
    # Given the facade's documented constants
    documented = doc_comments(facade)
    assert documented, "the facade documents no constant: the check would be vacuous"
    # Then each has exactly one defining module, with the same comment and value
    for name, comment in documented.items():
        owners = [m for m in PARTS[facade] if name in doc_comments(m)]
        assert len(owners) == 1, (name, [m.__name__ for m in owners])
        assert doc_comments(owners[0])[name] == comment, name
        assert getattr(owners[0], name) is getattr(facade, name), name


@pytest.mark.parametrize("facade", list(PARTS), ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_exported_name_resolves(facade):
    missing = [name for name in facade.__all__ if not hasattr(facade, name)]
    assert not missing


def test_private_aliases_are_the_real_objects():
    # The fast-path property tests go through these aliases: they must test
    # what Request/Response.validate actually call.
    assert protocol._response_fast is wire_schemas.response_fast
    assert protocol._request_fast is wire_schemas.request_fast
    assert protocol._RESPONSE_VALIDATOR is wire_schemas.RESPONSE_VALIDATOR
    assert protocol._REQUEST_VALIDATOR is wire_schemas.REQUEST_VALIDATOR
    assert protocol.Request.SCHEMA is wire_schemas.REQUEST_VALIDATOR.schema
    assert protocol.Response.SCHEMA is wire_schemas.RESPONSE_VALIDATOR.schema
    assert events._decode is event_receiver.decode


def test_parts_never_import_their_facade():
    # A part importing its facade would be an import cycle: importing that
    # part first would then fail halfway.
    for facade, parts in PARTS.items():
        for part in parts:
            tree = ast.parse(inspect.getsource(part))
            imported = {alias.name for node in ast.walk(tree)
                        if isinstance(node, (ast.Import, ast.ImportFrom))
                        for alias in node.names}
            imported |= {node.module for node in ast.walk(tree)
                         if isinstance(node, ast.ImportFrom) and node.module}
            short = facade.__name__.rsplit(".", 1)[1]
            assert short not in imported and facade.__name__ not in imported, part.__name__
