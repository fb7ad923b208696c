"""Column types that let flowengine share TaskFlow's tables on every database.

:class:`JSONText`: a JSON document flowengine reads and writes as text.

flowengine encodes and decodes its documents itself (``rows``, with errors
naming the record and field); TaskFlow's tables store them as ``JSON`` on
PostgreSQL. :class:`JSONText` binds the text with ``CAST(... AS JSON)`` and
selects the column with ``CAST(... AS TEXT)`` there (PostgreSQL's ``json``
keeps the text as written), so the same encoded text goes in and comes out
on every database; elsewhere the column is plain text (``LONGTEXT`` on MySQL).

:class:`Label`: a short string bound without a type cast. TaskFlow's
``atom_type`` and ``intention`` columns are PostgreSQL enums (``atom_types``,
``intention_type``) in a database TaskFlow created, and ``VARCHAR`` in one
flowengine created; psycopg's ``$1::VARCHAR`` cannot be assigned to an enum,
while an uncast parameter is accepted by both.
"""

from __future__ import annotations

from typing import Any

from flowengine.utils import optional

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import mysql
    from sqlalchemy.ext import compiler
    from sqlalchemy.sql import expression
    from sqlalchemy.sql.visitors import InternalTraversal
except ImportError as e:  # the 'sql' extra is not installed
    raise optional.missing_extra("sql", e) from e

__all__ = ["JSONText", "Label"]


class _AsJSON(expression.ColumnElement[Any]):
    """``CAST(x AS JSON)`` on PostgreSQL, ``x`` elsewhere."""

    # Made while compiling (never part of a cached statement's key), but
    # say what they wrap all the same.
    _traverse_internals = [("inner", InternalTraversal.dp_clauseelement)]
    inherit_cache = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.type = inner.type


class _AsText(expression.ColumnElement[Any]):
    """``CAST(x AS TEXT)`` on PostgreSQL, ``x`` elsewhere."""

    # Made while compiling (never part of a cached statement's key), but
    # say what they wrap all the same.
    _traverse_internals = [("inner", InternalTraversal.dp_clauseelement)]
    inherit_cache = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.type = inner.type


@compiler.compiles(_AsJSON)
@compiler.compiles(_AsText)
def _plain(element: Any, comp: Any, **kw: Any) -> str:
    return str(comp.process(element.inner, **kw))


@compiler.compiles(_AsJSON, "postgresql")
def _cast_to_json(element: Any, comp: Any, **kw: Any) -> str:
    return f"CAST({comp.process(element.inner, **kw)} AS JSON)"


@compiler.compiles(_AsText, "postgresql")
def _cast_to_text(element: Any, comp: Any, **kw: Any) -> str:
    return f"CAST({comp.process(element.inner, **kw)} AS TEXT)"


class JSONText(sa.types.TypeDecorator[str]):
    """JSON text in, the same text out; ``JSON`` on PostgreSQL (see the module doc)."""

    impl = sa.Text
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.engine.Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            # MySQL's TEXT stops at 64 KiB, too small for some results.
            return dialect.type_descriptor(mysql.LONGTEXT())
        return dialect.type_descriptor(sa.Text())

    def bind_expression(self, bindvalue: Any) -> Any:
        return _AsJSON(bindvalue)

    def column_expression(self, column: Any) -> Any:
        return _AsText(column)


class Label(sa.types.UserDefinedType[str]):
    """``VARCHAR(length)`` whose bound values carry no cast (see the module doc)."""

    cache_ok = True

    def __init__(self, length: int) -> None:
        self.length = length

    def get_col_spec(self, **kw: Any) -> str:
        return f"VARCHAR({self.length})"
