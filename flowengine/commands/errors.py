"""The error commands raise when they refuse what they were asked."""

from __future__ import annotations

from flowengine import exceptions as exc

#: Exit status of a command that refused before doing anything (bad
#: argument, unknown or ambiguous flow, unsafe action without --force).
EXIT_REFUSED = 2


class CommandError(exc.FlowEngineError):
    """A command refused: the message is the one line the user reads (exit status 2)."""
