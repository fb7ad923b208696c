"""The Redis board in TaskFlow 6.5's own layout and encoding (``compat='taskflow'``).

TaskFlow's and flowengine's conductors then share one board during a
rolling replacement: each claims, runs and finishes the other's postings.
The keys and what each side reads are in
:mod:`flowengine.jobs.backends.redis_taskflow_scripts`; postings are
TaskFlow's msgpack (:mod:`.taskflow_codec`).

What holds: flowengine's claims are leases (``.owned`` expires unless the
keeper renews it) and carry fencing tokens among flowengine claimers; a
TaskFlow claim taken after a flowengine lease ran out fences the old
claimer by its name. TaskFlow's own claims never expire and carry no
token. TaskFlow publishes nothing, so besides flowengine's own events the
board re-reads the listing every ``taskflow_poll_s`` (TaskFlow's boards
poll as well). A posting that is not TaskFlow's msgpack is skipped with
one warning, never deleted.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from flowengine import exceptions as exc
from flowengine.jobs import records
from flowengine.jobs.backends import redis_client, redis_taskflow_scripts, taskflow_codec
from flowengine.jobs.backends.impl_redis import RedisStore, claim_from_reply, raw_command
from flowengine.jobs.records import Claim, JobRecord, Outcome
from flowengine.jobs.store import Action, BoardEvent, EventKind

__all__ = ["DEFAULT_NAMESPACE", "POLL_S", "TaskflowRedisStore"]

LOG = logging.getLogger(__name__)

#: TaskFlow's default namespace.
DEFAULT_NAMESPACE = "taskflow"
#: How often the board re-reads a listing TaskFlow may have changed without
#: telling anyone (seconds; conf ``taskflow_poll_s``). TaskFlow's own
#: conductors look every 0.5-1 s; this matches them without doubling the load.
POLL_S = 1.0
_TICK = {"type": "tick"}


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)  # TaskFlow's naive UTC


def _as_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class TaskflowRedisStore(RedisStore):
    """A :class:`~flowengine.jobs.store.BoardStore` on TaskFlow's Redis keys."""

    SCRIPTS = redis_taskflow_scripts
    CHANNEL = "flowengine.events"
    LISTED_KEY = "listings"  # TaskFlow's
    FOREIGN = (
        "another program (a flowengine board without compat='taskflow', whose"
        " postings are JSON?); give it a namespace of its own"
    )

    def __init__(
        self,
        client: redis_client.TextClient,
        namespace: str,
        where: str,
        owns_client: bool = True,
        reopen: Callable[[], redis_client.TextClient] | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        super().__init__(client, namespace, where, owns_client, reopen)
        self._poll_s = poll_s

    def _key(self, *parts: str) -> str:
        # TaskFlow's keys: "<ns>:" then the pieces joined with ".".
        return f"{self._ns}:{'.'.join(parts)}"

    def _job_keys(self, uuid: str) -> dict[str, str]:
        return {
            name: self._key(uuid, name)
            for name in ("owned", "last_modified", "flowengine", "outcome", "done")
        }

    # Events: flowengine's own, plus a re-read every poll period for TaskFlow's changes.

    def _receive(self, pubsub: Any) -> list[Any]:
        msg = pubsub.get_message(timeout=self._poll_s)
        return [msg] if msg else [_TICK]

    def _decode(self, msg: dict[str, Any]) -> BoardEvent | None:
        if msg is _TICK:
            return BoardEvent(EventKind.RESYNC)
        return super()._decode(msg)

    # Reading.

    def _posting(
        self, key: str, uuid: str, blob: bytes | None, where: str
    ) -> dict[str, Any] | None:
        """The posting in ``blob``; None (one warning per job) if it is not TaskFlow's."""
        if blob is None:
            return None
        try:
            posting = taskflow_codec.loads(blob)
            if posting.get("uuid") != uuid or "name" not in posting:
                raise ValueError(
                    f"a map with uuid {posting.get('uuid')!r} and keys"
                    f" {sorted(map(str, posting))}, not a posting of job {uuid}"
                )
        except ValueError as e:
            self._skip(key, uuid, f"it is {e}")
            return None
        posting["sequence"] = int(posting.get("sequence") or 0)
        created = posting.get("created_on")
        if isinstance(created, datetime.datetime):  # as flowengine's postings carry it
            posting["created_on"] = created.isoformat()
        return posting

    def _raw_hash(self, key: str) -> dict[str, bytes]:
        with redis_client.translated(self._where):
            raw = raw_command(self._client, "HGETALL", key)
        return {_as_text(k): v for k, v in (raw or {}).items()}

    def _facts(self, uuids: Sequence[str]) -> tuple[list[Any], tuple[int, int]]:
        """Per job: (holder, pttl, side hash); and the server's TIME."""
        with redis_client.translated(self._where):
            pipe = self._client.pipeline(transaction=True)
            pipe.time()
            for uuid in uuids:
                keys = self._job_keys(uuid)
                pipe.get(keys["owned"])
                pipe.pttl(keys["owned"])
                pipe.hgetall(keys["flowengine"])
            server_now, *replies = pipe.execute()
        return [tuple(replies[3 * i : 3 * i + 3]) for i in range(len(uuids))], server_now

    def _record(
        self,
        uuid: str,
        posting: Any,
        state: dict[str, str],
        owner: Any,
        pttl: int,
        where: str,
        server_now: tuple[int, int],
    ) -> JobRecord:
        holder = cast(str | None, owner)
        now = time.time()
        left_s = int(state.get("not_before") or 0) / 1000.0 - (server_now[0] + server_now[1] / 1e6)
        leased = holder is not None and where == records.LISTED
        return JobRecord(
            posting,
            attempts=int(state.get("attempts") or 0),
            token=int(state.get("token") or 0),
            owner=holder if leased else state.get("owner"),
            leased=leased,
            lease_expires_at=now + pttl / 1000.0 if leased and pttl > 0 else None,
            not_before=now + left_s if left_s > 0 else None,
            where=where,
        )

    def _records(self, hash_key: str, where: str) -> list[JobRecord]:
        postings = {}
        for uuid, blob in self._raw_hash(hash_key).items():
            posting = self._posting(hash_key, uuid, blob, where)
            if posting is not None:
                postings[uuid] = posting
        if not postings:
            return []
        facts, server_now = self._facts(list(postings))
        return [
            self._record(uuid, posting, side, holder, pttl, where, server_now)
            for (uuid, posting), (holder, pttl, side) in zip(postings.items(), facts)
        ]

    def listing(self) -> list[JobRecord]:
        """Every listed job TaskFlow's encoding lets us read."""
        return self._records(self._listed, records.LISTED)

    def count(self) -> int:
        """How many readable jobs are listed."""
        return len(self.listing())

    def parked(self, where: str) -> list[JobRecord]:
        """Jobs in TaskFlow's trash or flowengine's dead letter."""
        key = self._key("trash") if where == records.IN_TRASH else self._key("flowengine", "dead")
        return self._records(key, where)

    def get(self, uuid: str) -> JobRecord | None:
        """The job wherever it is (listed, trash, dead letter, consumed), or None."""
        keys = self._job_keys(uuid)
        places = (
            (records.LISTED, self._listed),
            (records.IN_TRASH, self._key("trash")),
            (records.IN_DEAD_LETTER, self._key("flowengine", "dead")),
        )
        with redis_client.translated(self._where):
            pipe = self._client.pipeline(transaction=False)  # NEVER_DECODE needs no MULTI
            for _where, key in places:
                raw_command(pipe, "HGET", key, uuid)
            raw_command(pipe, "GET", keys["done"])
            blobs = pipe.execute()
        for (where, key), blob in zip((*places, (records.CONSUMED, keys["done"])), blobs):
            posting = self._posting(key, uuid, blob, where)
            if posting is not None:
                facts, server_now = self._facts([uuid])
                holder, pttl, side = facts[0]
                return self._record(uuid, posting, side, holder, pttl, where, server_now)
        return None

    def outcome(self, uuid: str) -> Outcome | None:
        """The outcome flowengine recorded, or None (TaskFlow records none)."""
        with redis_client.translated(self._where):
            raw = self._client.get(self._job_keys(uuid)["outcome"])
        return None if raw is None else Outcome.from_dict(json.loads(raw))

    def lease_remaining(self, uuid: str) -> float | None:
        """Seconds left on the claim (None: unclaimed, or a TaskFlow claim without expiry)."""
        with redis_client.translated(self._where):
            pttl = self._client.pttl(self._job_keys(uuid)["owned"])
        return None if pttl < 0 else pttl / 1000.0

    # Changing.

    def post(self, posting: dict[str, Any], max_attempts: int) -> JobRecord:
        """INCR TaskFlow's sequence, then store the msgpack posting (as TaskFlow does)."""
        uuid = posting["uuid"]
        with redis_client.translated(self._where):
            sequence = int(self._client.incr(self._key("sequence")))
        created = posting.get("created_on")
        body = {
            **posting,
            "sequence": sequence,
            "created_on": (
                datetime.datetime.fromisoformat(created)
                if isinstance(created, str)
                else created or _utcnow()
            ),
        }
        reply = self._run(
            "POST",
            [self._listed, self._job_keys(uuid)["flowengine"]],
            [uuid, taskflow_codec.dumps(body), self.channel],
        )
        if reply[0] != "ok":
            raise exc.JobFailure(f"Job {uuid} could not be posted: it already exists")
        return JobRecord(body)

    def claim(
        self, uuid: str, who: str, lease_s: float, max_attempts: int, outcome_ttl_s: float
    ) -> Claim:
        """TaskFlow's claim (``.owned`` = who) with a lease and a token (see the scripts)."""
        keys = self._job_keys(uuid)
        reply = self._run(
            "CLAIM",
            [
                self._listed,
                keys["owned"],
                keys["last_modified"],
                keys["flowengine"],
                self._key("flowengine", "token"),
                self._key("flowengine", "dead"),
                keys["outcome"],
            ],
            [
                uuid,
                who,
                max(1, int(lease_s * 1000)),
                max_attempts,
                int(outcome_ttl_s * 1000),
                self.channel,
                taskflow_codec.dumps(_utcnow()),
            ],
        )
        return claim_from_reply(uuid, who, reply)

    def renew(self, held: Sequence[tuple[str, int]], lease_s: float) -> set[str]:
        """One script extends every held lease; returns the lost uuids."""
        if not held:
            return set()
        keys: list[str] = []
        args: list[Any] = [max(1, int(lease_s * 1000))]
        for uuid, token in held:
            jk = self._job_keys(uuid)
            keys += [jk["owned"], jk["flowengine"]]
            args += [uuid, str(token)]
        keys.append(self._listed)
        return set(self._run("RENEW", keys, args))

    def finish(
        self,
        uuid: str,
        who: str,
        token: int,
        action: Action,
        *,
        outcome: str | None = None,
        reason: str | None = None,
        backoff_s: float = 0.0,
        max_attempts: int = 1,
        outcome_ttl_s: float = 0.0,
    ) -> Outcome | None:
        """Consume / trash / abandon / fail as TaskFlow would, fenced (one script)."""
        keys = self._job_keys(uuid)
        reply = self._run(
            "FINISH",
            [
                self._listed,
                keys["owned"],
                keys["last_modified"],
                keys["flowengine"],
                keys["outcome"],
                self._key("trash"),
                self._key("flowengine", "dead"),
                keys["done"],
            ],
            [
                uuid,
                who,
                str(token),
                action.value,
                outcome or records.SUCCEEDED,
                reason or "",
                int(backoff_s * 1000),
                max_attempts,
                max(1, int(outcome_ttl_s * 1000)),
                self.channel,
                taskflow_codec.dumps(_utcnow()),
            ],
        )
        status = reply[0]
        if status == "done":
            return Outcome.from_dict(json.loads(reply[1]))
        if status == "released":
            return None
        if status == "unknown":
            raise exc.NotFound(f"Job {uuid} not found to {action.value}")
        if status == "unclaimed":
            raise exc.NotFound(f"Can not {action.value} job {uuid}: nobody claimed it")
        if status == "lost":
            raise exc.ClaimLost(
                f"Can not {action.value} job {uuid}: claim {token} was"
                f" superseded by claim {reply[1]} of {reply[2]}"
            )
        raise exc.JobFailure(
            f"Can not {action.value} job {uuid} which is not owned by"
            f" {who} (it is owned by {reply[1]})"
        )

    def requeue(self, uuid: str, max_attempts: int) -> JobRecord:
        """Back on TaskFlow's listing from the trash or dead letter, attempts reset."""
        keys = self._job_keys(uuid)
        reply = self._run(
            "REQUEUE",
            [
                self._listed,
                self._key("trash"),
                self._key("flowengine", "dead"),
                keys["flowengine"],
                keys["outcome"],
            ],
            [uuid, self.channel],
        )
        if reply[0] != "ok":
            raise exc.NotFound(f"Job {uuid} is neither trashed nor dead-lettered")
        found = self.get(uuid)
        if found is None:
            raise exc.NotFound(f"Job {uuid} vanished right after being requeued")
        return found

    def register_entity(self, entity: dict[str, Any], ttl_s: float) -> None:
        """TaskFlow's Redis board registers nothing; flowengine keeps its own key."""
        with redis_client.translated(self._where):
            self._client.set(
                self._key("flowengine", "entity", str(entity["name"])),
                json.dumps(entity),
                px=max(1, int(ttl_s * 1000)),
            )
