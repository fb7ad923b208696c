"""Server URLs read from the environment when the command line does not give them.

An argument is visible to every user of the machine (``ps``, ``/proc/*/cmdline``)
and often lands in shell history and service-manager logs; a URL carrying a
password belongs in the environment instead (a systemd ``EnvironmentFile``
readable by the service only; see deployment.rst). ``--backend`` has read
``$FLOWENGINE_BACKEND`` the same way (see :mod:`.backend_url`).
"""

from __future__ import annotations

import argparse
import os

#: The broker URL of workers, engines and the commands that talk to workers.
BROKER_ENV = "FLOWENGINE_BROKER_URL"
#: The jobboard URL of conductors and ``jobs``.
BOARD_ENV = "FLOWENGINE_BOARD"
#: The persistence URL of conductors and ``jobs post``.
PERSISTENCE_ENV = "FLOWENGINE_PERSISTENCE"

#: Commands whose ``--url`` is not read from the environment: the demo runs
#: on a transport of its own unless told otherwise, whatever the shell holds.
_OWN_BROKER = ("demo",)


def fill(args: argparse.Namespace) -> str | None:
    """Fill the URLs ``args`` lacks from the environment; a problem to report, or None.

    ``--url`` is taken from :data:`BROKER_ENV` only when neither ``--url``
    nor ``--transport`` was given (a transport named on the command line
    says which broker is meant). ``--board`` and ``--persistence``, where a
    command needs them, must come from one place or the other.
    """
    if (
        args.command not in _OWN_BROKER
        and getattr(args, "url", "") is None
        and getattr(args, "transport", None) is None
    ):
        args.url = os.environ.get(BROKER_ENV) or None
    for attr, env in (("board", BOARD_ENV), ("persistence", PERSISTENCE_ENV)):
        if getattr(args, attr, "") is None:
            setattr(args, attr, os.environ.get(env) or None)
            if getattr(args, attr) is None and attr in getattr(args, "needs_urls", ()):
                return f"the following arguments are required: --{attr} (or ${env})"
    return None
