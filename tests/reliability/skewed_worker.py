"""``python -m tests.reliability.skewed_worker OFFSET_S worker ...``: a worker whose clock is off.

Installs a clock ``OFFSET_S`` seconds ahead (negative: behind) of the host's
for the whole of flowengine in this process (every wall-clock reading of
``worker_based`` goes through ``wire/clock.py``), then runs the
``flowengine`` command line with the remaining arguments, as a host whose
system clock is badly set would run it. The task records the fault tasks
write keep the host's clock, so the checker still compares like with like.
"""

from __future__ import annotations

import sys

from flowengine.cli import main
from flowengine.engines.worker_based.wire import clock

if __name__ == "__main__":
    clock.install(clock.OffsetClock(float(sys.argv[1])))
    sys.exit(main(sys.argv[2:]))
