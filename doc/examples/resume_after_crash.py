"""Resume a flow after its engine process was killed in the middle of a task.

Run it: ``python resume_after_crash.py``. It starts itself a second time as
the *engine process*, which runs a three-step order flow (reserve, charge,
ship) saving its progress to a SQLite file. While ``charge`` is running that
process is killed with SIGKILL -- as a crash or an OOM kill would. This
process then reads the saved flow detail back and resumes it: ``reserve``,
which had finished, is not run again; ``charge``, interrupted, runs again;
``ship`` runs; the flow ends SUCCESS.

Only a JSON-storing backend outlives the process: ``sqlite:///file`` here;
``dir:///path`` or ``postgresql://...`` work the same way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from flowengine import engines, task
from flowengine.patterns import linear_flow as lf
from flowengine.persistence import backends, models

# The engine process is killed long before this; it only stops an orphan.
BLOCK_LIMIT_S = 60
# Bound on waiting for the engine process to reach 'charge' (fail, never hang).
WAIT_LIMIT_S = 60
ENGINE_PROCESS_ENV = "RESUME_EXAMPLE_ENGINE_PROCESS"


def count_run(workdir: str, name: str) -> None:
    """Append the step's name to a file: executions are counted across processes."""
    with open(os.path.join(workdir, "executions.log"), "a") as fp:
        fp.write(name + "\n")


class Reserve(task.Task):
    def execute(self, workdir, order_id):
        count_run(workdir, self.name)
        return f"stock-for-{order_id}"


class Charge(task.Task):
    def execute(self, workdir, order_id):
        count_run(workdir, self.name)
        if os.environ.get(ENGINE_PROCESS_ENV):
            print("charging", flush=True)  # tells the parent we are mid-task
            threading.Event().wait(BLOCK_LIMIT_S)
        return f"charged-{order_id}"


class Ship(task.Task):
    def execute(self, workdir, reservation, receipt):
        count_run(workdir, self.name)
        return f"shipped {reservation} ({receipt})"


def make_flow(workdir: str, order_id: int) -> lf.Flow:
    """The flow factory: saved by name so a new process can rebuild the flow."""
    return lf.Flow("order").add(
        Reserve(
            "reserve", provides="reservation", inject={"workdir": workdir, "order_id": order_id}
        ),
        Charge("charge", provides="receipt", inject={"workdir": workdir, "order_id": order_id}),
        Ship("ship", provides="shipment", inject={"workdir": workdir}),
    )


def engine_process(db_url: str, workdir: str) -> None:
    """Child: start the flow, saving every step to the database."""
    with backends.backend(db_url) as backend:
        engine = engines.load_from_factory(
            make_flow, factory_args=[workdir, 42], backend=backend, book=models.LogBook("orders")
        )
        print(f"flow {engine.storage.flow_uuid}", flush=True)
        engine.run()


def main() -> None:
    workdir = tempfile.mkdtemp(prefix="resume-example-")
    db_url = f"sqlite:///{workdir}/flows.db"
    child = subprocess.Popen(
        [sys.executable, __file__, "--engine-process", db_url, workdir],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **{ENGINE_PROCESS_ENV: "1"}),
    )
    # Watchdog: if the child never reaches 'charge', kill it so readline returns.
    watchdog = threading.Timer(WAIT_LIMIT_S, child.kill)
    watchdog.start()
    try:
        flow_uuid = child.stdout.readline().split()[1]
        if child.stdout.readline().strip() != "charging":
            raise SystemExit("engine process did not reach 'charge'")
    finally:
        watchdog.cancel()
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    print("killed the engine process while 'charge' was running")

    with backends.backend(db_url) as backend:
        with contextlib.closing(backend.get_connection()) as conn:
            flow_detail = conn.get_flow_details(flow_uuid)
        saved = {ad.name: ad.state for ad in flow_detail}
        print("saved states: " + " ".join(f"{n}={saved[n]}" for n in ("reserve", "charge", "ship")))
        engine = engines.load_from_detail(flow_detail, backend=backend)
        engine.run()
        print(f"resumed flow ended {engine.storage.get_flow_state()}")
        print(engine.storage.fetch("shipment"))

    with open(os.path.join(workdir, "executions.log")) as fp:
        runs = fp.read().split()
    print("executions: " + " ".join(f"{n}={runs.count(n)}" for n in ("reserve", "charge", "ship")))
    shutil.rmtree(workdir)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--engine-process":
        engine_process(sys.argv[2], sys.argv[3])
    else:
        main()
