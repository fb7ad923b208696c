"""``python -m flowengine``: the same as the ``flowengine`` command."""

import sys

from flowengine.cli import main

if __name__ == "__main__":
    sys.exit(main())
