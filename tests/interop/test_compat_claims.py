"""What holds of flowengine's claims on a board in TaskFlow's layout (``compat='taskflow'``).

Each test drives a TaskFlow 6.5 board object and flowengine board objects
on one real Redis or ZooKeeper server, in this process, and checks what
doc/source/migration.rst promises: TaskFlow sees flowengine's claims, a
dead claimer's claim ends (lease on Redis, session on ZooKeeper), a claimer
whose claim was taken over is refused (fencing) whether a TaskFlow or a
flowengine conductor took it, and abandon / trash / consume look to
TaskFlow exactly like its own.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

pytest.importorskip("taskflow", reason="TaskFlow is not installed (pip install -e .[interop])")
pytest.importorskip(
    "msgpack", reason="msgpack is not installed (pip install -e .[taskflow-compat])"
)

import sqlalchemy as sa  # noqa: E402
from taskflow import exceptions as tf_exc  # noqa: E402
from taskflow import states as tf_states  # noqa: E402
from taskflow.jobs import backends as tf_backends  # noqa: E402

from flowengine import exceptions as exc  # noqa: E402
from flowengine.jobs import backends  # noqa: E402
from tests import waiting  # noqa: E402

pytestmark = pytest.mark.broker

#: A short lease, so a dead claimer's claim ends quickly (Redis: the owner
#: key's expiry; ZooKeeper: the session timeout, at least 2 s).
LEASE_S = 0.5


@pytest.fixture(params=["redis", "zookeeper"])
def conf(request: pytest.FixtureRequest) -> dict[str, Any]:
    """TaskFlow's conf of a fresh board on the session's server."""
    if request.param == "redis":
        url = sa.engine.make_url(request.getfixturevalue("redis_url"))
        return {
            "board": "redis",
            "host": url.host,
            "port": url.port,
            "namespace": f"claims-{uuid.uuid4().hex[:8]}",
        }
    return {
        "board": "zookeeper",
        "hosts": request.getfixturevalue("zk_hosts"),
        "path": f"/claims-{uuid.uuid4().hex[:8]}/jobs",
    }


@pytest.fixture
def boards(conf: dict[str, Any]) -> Any:
    """``make(library, **options)``: connected boards on the test's board, closed after it."""
    made: list[Any] = []

    def make(library: str, **options: Any) -> Any:
        if library == "taskflow":
            board = tf_backends.fetch("taskflow", dict(conf))
        else:
            board = backends.fetch("flowengine", dict(conf, compat="taskflow", **options))
        board.connect()
        made.append(board)
        return board

    yield make
    for board in made:
        board.close()


def _taskflow_job(board: Any, job_uuid: str) -> Any:
    return next(j for j in board.iterjobs(ensure_fresh=True) if j.uuid == job_uuid)


def test_taskflow_sees_flowengines_claim_and_its_end(boards: Any) -> None:
    # Given a job claimed by a flowengine conductor
    theirs, ours = boards("taskflow"), boards("flowengine")
    job = ours.post("claimed-by-flowengine")
    ours.claim(job, "fe-conductor")
    tf_job = _taskflow_job(theirs, job.uuid)
    # Then TaskFlow sees the claim and cannot take it
    assert tf_job.state == tf_states.CLAIMED
    assert theirs.find_owner(tf_job) == "fe-conductor"
    # (TaskFlow's ZooKeeper board words it "claim failed due to transaction not
    # succeeding" even against its own claims.)
    with pytest.raises(tf_exc.UnclaimableJob):
        theirs.claim(tf_job, "tf-conductor")
    # When flowengine abandons it, TaskFlow claims and consumes it as its own
    ours.abandon(job, "fe-conductor")
    assert tf_job.state == tf_states.UNCLAIMED
    theirs.claim(tf_job, "tf-conductor")
    assert ours.find_owner(job) == "tf-conductor"
    theirs.consume(tf_job, "tf-conductor")
    # (each board's listing follows the server's changes: ZooKeeper's by watches)
    waiting.wait_until(
        lambda: ours.job_count == 0 and theirs.job_count == 0,
        "both boards to see the consumed job gone",
    )


def test_flowengine_trash_is_taskflows_trash(boards: Any) -> None:
    theirs, ours = boards("taskflow"), boards("flowengine")
    job = theirs.post("trash-me", details={"k": "v"})
    fe_job = ours.get_job(job.uuid)
    assert fe_job.details == {"k": "v"} and fe_job.name == "trash-me"
    ours.claim(fe_job, "fe-conductor")
    ours.trash(fe_job, "fe-conductor", reason="bad input")
    assert [j.uuid for j in ours.trashed()] == [job.uuid]
    assert ours.outcome(job.uuid).outcome == "trashed"
    # TaskFlow's ZooKeeper board learns of the removal by a watch, a moment later
    waiting.wait_until(lambda: theirs.job_count == 0, "TaskFlow's board to drop the job")
    if hasattr(theirs, "trash_key"):  # Redis: TaskFlow's trash hash holds the posting
        assert theirs._client.hkeys(theirs.trash_key) == [job.uuid.encode()]
    else:  # ZooKeeper: TaskFlow's .trash folder holds the jobNNN znode
        assert theirs._client.get_children(theirs.trash_path) == [job.path.rsplit("/", 1)[1]]


def test_a_dead_flowengine_claimers_job_goes_to_taskflow_and_the_claimer_is_fenced(
    boards: Any,
) -> None:
    # Given a flowengine conductor that claimed a job, then stopped renewing
    # (Redis: its lease runs out) or lost its session (ZooKeeper)
    theirs = boards("taskflow")
    dying = boards("flowengine", lease_s=LEASE_S)
    job = dying.post("survives-its-claimer")
    dying.claim(job, "fe-dying", expiry=LEASE_S)  # never renewed
    if dying._store.__class__.__name__.startswith("TaskflowZk"):
        dying.close()  # the session ends: ZooKeeper drops its lock at once
        dying.connect()
    # When TaskFlow's conductor takes the job once the claim ended
    tf_job = _taskflow_job(theirs, job.uuid)
    waiting.wait_until(
        lambda: tf_job.state == tf_states.UNCLAIMED, "the dead claimer's claim to end", timeout=30
    )
    theirs.claim(tf_job, "tf-conductor")
    # Then the old claimer can neither finish nor give it back
    for finish in (dying.consume, dying.abandon, dying.trash):
        with pytest.raises(exc.ClaimLost, match="TaskFlow claim of tf-conductor"):
            finish(job, "fe-dying")
    theirs.consume(tf_job, "tf-conductor")
    waiting.wait_until(lambda: dying.job_count == 0, "the consumed job to leave the board")


def test_flowengine_claimers_fence_each_other_on_taskflows_layout(boards: Any) -> None:
    # Given a claim that ended without being finished, and a second flowengine claimer
    first, second = boards("flowengine", lease_s=LEASE_S), boards("flowengine")
    job = first.post("claimed-twice")
    first.claim(job, "fe-conductor", expiry=LEASE_S)
    if first._store.__class__.__name__.startswith("TaskflowZk"):
        first.close()
        first.connect()
    again = second.get_job(job.uuid)
    waiting.wait_until(
        lambda: second.find_owner(again) is None, "the first claim to end", timeout=30
    )
    second.claim(again, "fe-conductor")  # the same name: only the token tells them apart
    # Then the first claim's token is refused, the second one's accepted
    assert again.token > job.token
    with pytest.raises(exc.ClaimLost):
        first.consume(job, "fe-conductor")
    second.consume(again, "fe-conductor")
    assert second.outcome(again).outcome == "succeeded"


def test_jobs_list_shows_taskflows_postings_with_their_msgpack_types(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import datetime
    import json

    from flowengine import cli

    # Given a TaskFlow posting whose details hold values JSON has not
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    url = sa.engine.make_url(redis_url)
    theirs = tf_backends.fetch(
        "taskflow", {"board": "redis", "host": url.host, "port": url.port, "namespace": namespace}
    )
    theirs.connect()
    try:
        job = theirs.post("tf-job", details={"when": datetime.datetime(2020, 1, 2)})
    finally:
        theirs.close()
    # When `flowengine jobs list --json` reads the board in compat mode
    rc = cli.main(
        ["jobs", "list", "--json", "--board", f"{redis_url}?namespace={namespace}&compat=taskflow"]
    )
    # Then it lists the job, its times as text
    assert rc in (0, None)
    listed = json.loads(capsys.readouterr().out)
    assert [(j["uuid"], j["name"]) for j in listed] == [(job.uuid, "tf-job")]
    assert listed[0]["details"] == {"when": "2020-01-02 00:00:00"}
    assert listed[0]["created_on"] == job.created_on.isoformat()
