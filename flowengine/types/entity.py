"""An entity taking part in a jobboard (a conductor): its kind, name and metadata."""

from __future__ import annotations

from typing import Any


class Entity:
    """Something that claims jobs: ``kind`` (e.g. "conductor"), ``name`` and ``metadata``."""

    def __init__(self, kind: str, name: str, metadata: dict[str, Any] | None) -> None:
        self.kind = kind
        self.name = name
        self.metadata = metadata

    def to_dict(self) -> dict[str, Any]:
        """The entity as a plain dict (kind, name, metadata)."""
        return {"kind": self.kind, "name": self.name, "metadata": self.metadata}

    def __repr__(self) -> str:
        return f"Entity(kind={self.kind!r}, name={self.name!r})"
