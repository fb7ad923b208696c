"""The worker-based tests mirror the package's subpackages (transports/, messaging/,
wire/, executor_side/, worker_side/, events/) and share the helpers and task
modules kept here, which tests and the worker processes they start import by
module name (``worker_tasks.Add`` is a task's name on the wire)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
