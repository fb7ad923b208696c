#!/usr/bin/env python3
"""Print a command the README gives, so CI runs it exactly as a reader would.

The README marks each such command with an HTML comment (invisible once
rendered) on the line before its fenced block::

    <!-- ci: quick-start -->
    ```sh
    pip install -e . && flowengine demo
    ```

``python tools/readme_commands.py quick-start`` prints the block's lines.
A missing or empty block is an error: CI must not pass by running nothing.
"""

from __future__ import annotations

import argparse
import os
import sys

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def command(name: str, text: str) -> str:
    """The fenced block after ``<!-- ci: NAME -->`` in ``text``; ValueError if absent."""
    lines = text.splitlines()
    marker = f"<!-- ci: {name} -->"
    try:
        start = lines.index(marker)
    except ValueError:
        raise ValueError(f"README has no {marker!r} marker") from None
    if start + 1 >= len(lines) or not lines[start + 1].startswith("```"):
        raise ValueError(f"{marker!r} is not followed by a fenced block")
    body = []
    for line in lines[start + 2 :]:
        if line.startswith("```"):
            break
        body.append(line)
    else:
        raise ValueError(f"the block after {marker!r} is not closed")
    if not any(line.strip() for line in body):
        raise ValueError(f"the block after {marker!r} is empty")
    return "\n".join(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the marker's name, e.g. quick-start")
    args = parser.parse_args(argv)
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    try:
        print(command(args.name, text))
    except ValueError as e:
        print(f"readme_commands: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
