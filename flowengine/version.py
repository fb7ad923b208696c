"""flowengine's version, under the names TaskFlow's ``version`` module offers."""

from __future__ import annotations

from flowengine import __version__

#: Who makes it and under what name (shown by tools that print versions).
PRODUCT_VENDOR = "flowengine developers"
PRODUCT_NAME = "flowengine"


def version_string() -> str:
    """The version, e.g. ``0.1.0``."""
    return __version__


def version_string_with_package() -> str:
    """The version with the distribution package's suffix (flowengine has none)."""
    return __version__
