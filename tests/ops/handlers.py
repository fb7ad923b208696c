"""Exception handlers the worker tests install with --exception-handler."""

from __future__ import annotations

import json
import os

from flowengine.engines.worker_based.worker_side.exception_handlers import FailedRequest


def record(failed: FailedRequest) -> None:
    """Append the failure to $OPS_FAILURES_FILE as one JSON line (and fall through)."""
    with open(os.environ["OPS_FAILURES_FILE"], "a", encoding="utf-8") as fh:
        fh.write(
            json.dumps(
                {
                    "task": failed.task_name,
                    "request": failed.request_uuid,
                    "error": failed.failure.exception_str,
                    "types": list(failed.failure.exc_type_names),
                }
            )
            + "\n"
        )


def swallow(failed: FailedRequest) -> bool:
    """Stop the chain: the default WARNING line is not written."""
    return False
