"""The Redis jobboard (TaskFlow's ``RedisJobBoard`` name and configuration keys).

Each operation is one Lua script (see :mod:`.redis_scripts`); leases are
keys that expire on the server (``PEXPIRE``), tokens come from ``INCR``,
board events are published on a channel that conductors and waiting posters
subscribe to, so nobody polls. Needs Redis 6.2 or newer; not Redis Cluster
(the scripts touch keys of several jobs).

Configuration: a URL (``redis://[:password@]host:port/db?namespace=x``,
``rediss://`` for TLS) or TaskFlow's keys ``host``, ``port``, ``db``,
``username``, ``password``, ``namespace``, ``socket_timeout``,
``socket_connect_timeout``, ``retry_on_timeout``, ``health_check_interval``,
``unix_socket_path``, ``encoding``, ``encoding_errors``, ``ssl``,
``ssl_keyfile``, ``ssl_certfile``, ``ssl_cert_reqs``, ``ssl_ca_certs``, and
Redis Sentinel's ``sentinel``, ``sentinel_fallbacks``, ``sentinel_kwargs``
(see :mod:`.redis_client`); plus the policy keys every board takes
(:mod:`flowengine.jobs.board`). Passwords never appear in logs.
``compat='taskflow'`` switches to TaskFlow 6.5's keys and msgpack postings
(:mod:`.redis_taskflow_layout`), to share a board with TaskFlow's conductors.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis import exceptions as redis_exc
from redis.client import NEVER_DECODE

from flowengine import exceptions as exc
from flowengine.jobs import board, records
from flowengine.jobs import job as job_mod
from flowengine.jobs.backends import compat, event_thread, redis_client, redis_scripts
from flowengine.jobs.records import Claim, JobRecord, Outcome
from flowengine.jobs.store import (
    Action,
    BoardEvent,
    BoardStore,
    EventKind,
    Finished,
    finish_order,
    held,
    newest_first,
)
from flowengine.utils import redis_replicas

__all__ = ["RedisJob", "RedisJobBoard", "RedisStore", "raw_command"]

LOG = logging.getLogger(__name__)

#: TaskFlow's namespace is b'taskflow'; ours differs so both boards can
#: share one Redis without reading each other's (differently encoded) jobs.
DEFAULT_NAMESPACE = "flowengine"
#: Oldest Redis server the board works with (see the module docstring).
MIN_REDIS_VERSION = (6, 2)
#: How long the event connection blocks per read before looking again
#: whether it was asked to stop (it is woken sooner by stop()).
EVENT_BLOCK_S = 5.0


def raw_command(client: Any, *command: str) -> Any:
    """Run ``command`` with its reply left as bytes (the board's client decodes text)."""
    return client.execute_command(*command, **{NEVER_DECODE: True})


def _glob_escape(text: str) -> str:
    """``text`` matched literally in a SCAN/KEYS pattern (a namespace may hold ``*``, ``[``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def claim_from_reply(uuid: str, who: str, reply: list[Any]) -> Claim:
    """The Claim a CLAIM script's reply grants, or the error saying why it did not.

    Both layouts' scripts (this board's and TaskFlow's) answer alike.
    """
    status = reply[0]
    if status == "ok":
        return Claim(uuid, who, int(reply[1]), int(reply[2]))
    if status == "unknown":
        raise exc.NotFound(f"Job {uuid} not found to be claimed")
    if status == "claimed":
        raise held(uuid, reply[1])
    if status == "backoff":
        raise exc.UnclaimableJob(
            f"Job {uuid} is backing off for another {int(reply[1]) / 1000:.1f} s"
        )
    raise exc.UnclaimableJob(
        f"Job {uuid} was claimed {reply[1]} times without finishing: moved to the dead letter"
    )


class RedisStore(BoardStore):
    """A :class:`BoardStore` on one Redis server (see the module docstring)."""

    #: The module whose scripts (named in its ``__all__``) connect() loads.
    SCRIPTS: Any = redis_scripts
    #: The key (below the namespace) of the board's event channel.
    CHANNEL = "events"
    #: The hash of listed jobs. Not TaskFlow's ``listings``: TaskFlow's boards
    #: read that hash and delete every posting in it they cannot decode.
    LISTED_KEY = "listed"
    #: Who may have written a posting this store cannot read (for the warning).
    FOREIGN = (
        "another program (TaskFlow's board, whose postings are msgpack?); give it a"
        " namespace of its own, or share its jobs with compat='taskflow'"
    )

    @property
    def namespace(self) -> str:
        """The prefix of every key of this board."""
        return self._ns

    def __init__(
        self,
        client: redis_client.TextClient,
        namespace: str,
        where: str,
        owns_client: bool = True,
        reopen: Callable[[], redis_client.TextClient] | None = None,
    ) -> None:
        self._client = client
        self._ns = namespace
        self._where = where
        self._owns_client = owns_client
        # Makes a new client for connect() after close() closed the one it owned.
        self._reopen = reopen
        self._client_closed = False
        self._scripts: dict[str, Any] = {}
        #: Replicas each script's writes must reach before it returns (see
        #: flowengine.utils.redis_replicas); None: do not wait.
        self.replicas: redis_replicas.ReplicaWait | None = None
        self._events: event_thread.EventThread | None = None
        self._unreadable: set[tuple[str, str]] = set()  # postings already warned about
        self.channel = self._key(self.CHANNEL)

    @property
    def _listed(self) -> str:
        """The key of the hash of listed jobs."""
        return self._key(self.LISTED_KEY)

    def _key(self, *parts: str) -> str:
        return ":".join((self._ns, *parts))

    def _job_keys(self, uuid: str) -> dict[str, str]:
        return {
            "state": self._key("state", uuid),
            "owner": self._key("owner", uuid),
            "outcome": self._key("outcome", uuid),
            "done": self._key("done", uuid),
        }

    @property
    def connected(self) -> bool:
        """Whether connect() succeeded and close() was not called since."""
        return bool(self._scripts)

    def connect(self) -> None:
        """Ping, check the server version, load the scripts."""
        if self._client_closed and self._reopen is not None:
            self._client = self._reopen()
            self._client_closed = False
        with redis_client.translated(self._where):
            redis_client.check_certificates(self._client)
            self._client.ping()
            version = str(self._client.info("server").get("redis_version", "0"))
            if tuple(int(p) for p in version.split(".")[:2]) < MIN_REDIS_VERSION:
                raise exc.JobFailure(
                    f"The Redis jobboard needs Redis 6.2 or newer; {self._where} runs {version}"
                )
            # Posts, claims, renewals and outcomes count once a replica has
            # them: a failover then loses none (see redis_replicas).
            scripted = redis_replicas.replicated(self._client, self.replicas, self._where)
            sources = {name: getattr(self.SCRIPTS, name) for name in self.SCRIPTS.__all__}
            # Loaded now, in one round trip: otherwise each script's first
            # call is refused (NOSCRIPT) and sent again after a SCRIPT LOAD.
            # (A restarted server forgets them: redis-py then loads them so.)
            pipe = self._client.pipeline(transaction=False)
            for source in sources.values():
                pipe.script_load(source)
            pipe.execute()
            self._scripts = {
                name: scripted.register_script(source) for name, source in sources.items()
            }

    def close(self) -> None:
        """Stop the event thread; close the client if this store made it."""
        if self._events is not None:
            self._events.stop()
            self._events = None
        self._scripts = {}
        if self._owns_client and not self._client_closed:
            redis_client.close_client(self._client)
            self._client_closed = True

    def _run(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        if not self._scripts:
            raise exc.JobFailure("The Redis jobboard is not connected (call connect())")
        with redis_client.translated(self._where):
            reply: list[Any] = self._scripts[name](keys=keys, args=args)
            return reply

    # Events.

    def subscribe(self, callback: Callable[[BoardEvent], None]) -> None:
        """Deliver the channel's events to ``callback`` (subscribed when this returns)."""
        if self._events is None:
            self._events = event_thread.EventThread(
                self._ns,
                self._open_pubsub,
                self._receive,
                lambda ps: ps.close(),
                self._decode,
                (redis_exc.ConnectionError, redis_exc.TimeoutError),
            )
            self._events.add(callback)
            if not self._events.start():
                raise exc.BoardUnavailable(
                    f"Could not subscribe to {self.channel} on {self._where}"
                )
        else:
            self._events.add(callback)

    def _open_pubsub(self) -> Any:
        # redis-py leaves pubsub() unannotated (its result is Any either way).
        pubsub = self._client.pubsub()  # type: ignore[no-untyped-call]
        pubsub.subscribe(self.channel)
        deadline = time.monotonic() + event_thread.SUBSCRIBE_TIMEOUT_S
        while time.monotonic() < deadline:  # wait for the confirmation
            msg = pubsub.get_message(timeout=deadline - time.monotonic())
            if msg and msg.get("type") == "subscribe":
                return pubsub
        pubsub.close()
        raise redis_exc.TimeoutError("subscription not confirmed")

    def _receive(self, pubsub: Any) -> list[Any]:
        msg = pubsub.get_message(timeout=EVENT_BLOCK_S)
        return [msg] if msg else []

    def _decode(self, msg: dict[str, Any]) -> BoardEvent | None:
        if msg.get("type") == "subscribe":  # redis-py re-subscribed after a reconnection
            return BoardEvent(EventKind.RESYNC)
        if msg.get("type") != "message":
            return None
        return BoardEvent.decode(msg.get("data") or "")

    # Reading.

    def _skip(self, key: str, uuid: str, why: object) -> None:
        """Warn (once per posting) that the posting at ``key[uuid]`` cannot be read."""
        if (key, uuid) in self._unreadable:
            return
        self._unreadable.add((key, uuid))
        LOG.warning(
            "Skipping the posting at %s[%s] on %s: %s. Left in place and not read"
            " again; namespace %r is shared with %s",
            key,
            uuid,
            self._where,
            why,
            self._ns,
            self.FOREIGN,
        )

    def _readable(self, key: str, blobs: dict[Any, Any]) -> dict[str, dict[str, Any]]:
        """uuid -> posting of each raw ``blobs`` entry that is a flowengine posting."""
        out = {}
        for raw_uuid, blob in blobs.items():
            uuid = (
                raw_uuid.decode("utf-8", "replace")
                if isinstance(raw_uuid, bytes)
                else str(raw_uuid)
            )
            try:
                text = blob.decode("utf-8") if isinstance(blob, bytes) else blob
                out[uuid] = records.decode_posting_fields(text, uuid, 0)
            except (UnicodeDecodeError, exc.JobFailure) as e:
                self._skip(key, uuid, e)
        return out

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
        data = {**posting, "sequence": int(state.get("sequence") or 0)}
        leased = bool(owner) and pttl != -2
        now = time.time()
        # not_before is on the server's clock: hand it out on this host's.
        left_s = int(state.get("not_before") or 0) / 1000.0 - (server_now[0] + server_now[1] / 1e6)
        return JobRecord(
            data,
            attempts=int(state.get("attempts") or 0),
            token=int(state.get("token") or 0),
            owner=state.get("owner"),
            leased=leased,
            lease_expires_at=now + pttl / 1000.0 if leased and pttl > 0 else None,
            not_before=now + left_s if left_s > 0 else None,
            where=where,
        )

    def _records(self, hash_key: str, where: str) -> list[JobRecord]:
        with redis_client.translated(self._where):
            postings = self._readable(
                hash_key, raw_command(self._client, "HGETALL", hash_key) or {}
            )
            if not postings:
                return []
            pipe = self._client.pipeline(transaction=True)
            pipe.time()
            for uuid in postings:
                keys = self._job_keys(uuid)
                pipe.hgetall(keys["state"])
                pipe.hgetall(keys["owner"])
                pipe.pttl(keys["owner"])
            server_now, *replies = pipe.execute()
        out = []
        for i, (uuid, posting) in enumerate(postings.items()):
            state, owner, pttl = replies[3 * i : 3 * i + 3]
            out.append(self._record(uuid, posting, state, owner, pttl, where, server_now))
        return out

    def listing(self) -> list[JobRecord]:
        """Every listed job."""
        return self._records(self._listed, records.LISTED)

    def count(self) -> int:
        """How many readable jobs are listed (another program's postings are not counted)."""
        return len(self.listing())

    def parked(self, where: str) -> list[JobRecord]:
        """Jobs in the trash or the dead letter."""
        return self._records(self._key(where), where)

    def get(self, uuid: str) -> JobRecord | None:
        """The job wherever it is, or None."""
        keys = self._job_keys(uuid)
        places = [
            (records.LISTED, self._listed),
            (records.IN_TRASH, self._key(records.IN_TRASH)),
            (records.IN_DEAD_LETTER, self._key(records.IN_DEAD_LETTER)),
        ]
        with redis_client.translated(self._where):
            # Postings as bytes (one may be another program's, not text), then the
            # claim facts in one transaction.
            raw = self._client.pipeline(transaction=False)
            for _where, key in places:
                raw_command(raw, "HGET", key, uuid)
            raw_command(raw, "GET", keys["done"])
            blobs = raw.execute()
            pipe = self._client.pipeline(transaction=True)
            pipe.hgetall(keys["state"])
            pipe.hgetall(keys["owner"])
            pipe.pttl(keys["owner"])
            pipe.time()
            state, owner, pttl, server_now = pipe.execute()
        for (where, key), blob in zip([*places, (records.CONSUMED, keys["done"])], blobs):
            if blob is not None:
                posting = self._readable(key, {uuid: blob}).get(uuid)
                if posting is not None:
                    return self._record(uuid, posting, state, owner, pttl, where, server_now)
        return None

    def finished(self, limit: int) -> list[Finished]:
        """Consumed jobs whose outcome is kept, newest first.

        Redis indexes them nowhere: their ``done`` keys are found with SCAN
        (a walk over the whole database, in steps), then every outcome is
        read in one round trip and the newest ``limit`` jobs are read as
        :meth:`get` does. Jobs TaskFlow's own conductors consumed
        (``compat='taskflow'``) leave no key, so they are not among them.
        """
        head, _, tail = self._job_keys("\0")["done"].partition("\0")
        pattern = f"{_glob_escape(head)}*{_glob_escape(tail)}"
        with redis_client.translated(self._where):
            uuids = sorted(
                {
                    key[len(head) : len(key) - len(tail)]
                    for key in self._client.scan_iter(match=pattern, count=500)
                }
            )
            if not uuids:
                return []
            pipe = self._client.pipeline(transaction=False)
            for uuid in uuids:
                pipe.get(self._job_keys(uuid)["outcome"])
            outcomes = [
                Outcome.from_dict(json.loads(raw)) for raw in pipe.execute() if raw is not None
            ]  # None: expired since the scan
        newest = sorted(outcomes, key=finish_order, reverse=True)[:limit]
        found = []
        for done in newest:
            rec = self.get(done.uuid)
            if rec is not None and rec.where == records.CONSUMED:
                found.append((rec, done))
        return newest_first(found, limit)

    def outcome(self, uuid: str) -> Outcome | None:
        """The recorded outcome, or None."""
        with redis_client.translated(self._where):
            raw = self._client.get(self._job_keys(uuid)["outcome"])
        return None if raw is None else Outcome.from_dict(json.loads(raw))

    def lease_remaining(self, uuid: str) -> float | None:
        """Seconds left on the current lease (PTTL of the owner key), or None."""
        with redis_client.translated(self._where):
            pttl = self._client.pttl(self._job_keys(uuid)["owner"])
        return None if pttl < 0 else pttl / 1000.0

    # Changing.

    def post(self, posting: dict[str, Any], max_attempts: int) -> JobRecord:
        """Store the posting (its sequence lives in the job's state hash)."""
        uuid = posting["uuid"]
        body = dict(posting)
        body.pop("sequence", None)
        encoded = records.encode_posting(body)
        reply = self._run(
            "POST",
            [self._listed, self._key("sequence"), self._job_keys(uuid)["state"]],
            [uuid, encoded, self.channel],
        )
        # The same posting already there is this post, sent again after its
        # answer was lost (the uuid is new): posted once, not a failure.
        if reply[0] != "ok" and reply[1] != encoded:
            raise exc.JobFailure(f"Job {uuid} could not be posted: it already exists")
        return JobRecord({**posting, "sequence": int(reply[-1])})

    def claim(
        self, uuid: str, who: str, lease_s: float, max_attempts: int, outcome_ttl_s: float
    ) -> Claim:
        """Lease the job to ``who`` (see BoardStore.claim)."""
        keys, args = self._claim_script_args(uuid, who, lease_s, max_attempts, outcome_ttl_s)
        return claim_from_reply(uuid, who, self._run("CLAIM", keys, args))

    def _claim_script_args(
        self, uuid: str, who: str, lease_s: float, max_attempts: int, outcome_ttl_s: float
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the CLAIM script."""
        keys = self._job_keys(uuid)
        return (
            [
                self._listed,
                keys["state"],
                keys["owner"],
                self._key("token"),
                self._key("dead"),
                keys["outcome"],
            ],
            [
                uuid,
                who,
                max(1, int(lease_s * 1000)),
                max_attempts,
                int(outcome_ttl_s * 1000),
                self.channel,
            ],
        )

    def renew(self, held: Sequence[tuple[str, int]], lease_s: float) -> set[str]:
        """One script extends every held lease; returns the lost uuids."""
        if not held:
            return set()
        keys: list[str] = []
        args: list[Any] = [max(1, int(lease_s * 1000))]
        for uuid, token in held:
            jk = self._job_keys(uuid)
            keys += [jk["owner"], jk["state"]]
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
        """Consume / trash / abandon / fail, fenced by ``token`` (one script)."""
        keys, args = self._finish_script_args(
            uuid, who, token, action, outcome, reason, backoff_s, max_attempts, outcome_ttl_s
        )
        return self._finished(uuid, token, action, who, self._run("FINISH", keys, args))

    def consume_and_claim(
        self,
        uuid: str,
        who: str,
        token: int,
        next_uuid: str,
        *,
        outcome: str,
        reason: str | None,
        lease_s: float,
        max_attempts: int,
        outcome_ttl_s: float,
    ) -> tuple[Outcome | None, Claim | None]:
        """Consume and claim the next job in ONE script (one round trip for both).

        The next job is claimed only if CLAIM would grant it (see
        BoardStore.consume_and_claim); the consume is :meth:`finish`'s.
        """
        if "CONSUME_AND_CLAIM" not in self._scripts:  # a layout without it (TaskFlow's)
            return super().consume_and_claim(
                uuid,
                who,
                token,
                next_uuid,
                outcome=outcome,
                reason=reason,
                lease_s=lease_s,
                max_attempts=max_attempts,
                outcome_ttl_s=outcome_ttl_s,
            )
        finish_keys, finish_args = self._finish_script_args(
            uuid, who, token, Action.CONSUME, outcome, reason, 0.0, max_attempts, outcome_ttl_s
        )
        claim_keys, claim_args = self._claim_script_args(
            next_uuid, who, lease_s, max_attempts, outcome_ttl_s
        )
        reply = self._run("CONSUME_AND_CLAIM", finish_keys + claim_keys, finish_args + claim_args)
        done = self._finished(uuid, token, Action.CONSUME, who, reply)
        if len(reply) < 4:
            return done, None
        return done, claim_from_reply(next_uuid, who, ["ok", reply[2], reply[3]])

    def _finish_script_args(
        self,
        uuid: str,
        who: str,
        token: int,
        action: Action,
        outcome: str | None,
        reason: str | None,
        backoff_s: float,
        max_attempts: int,
        outcome_ttl_s: float,
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the FINISH script."""
        keys = self._job_keys(uuid)
        return (
            [
                self._listed,
                keys["state"],
                keys["owner"],
                keys["outcome"],
                self._key("trash"),
                self._key("dead"),
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
            ],
        )

    @staticmethod
    def _finished(
        uuid: str, token: int, action: Action, who: str, reply: list[Any]
    ) -> Outcome | None:
        """What a FINISH script's ``reply`` says: the outcome, None (released), or the error."""
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
        """Back on the board from the trash or dead letter, attempts reset."""
        keys = self._job_keys(uuid)
        reply = self._run(
            "REQUEUE",
            [self._listed, self._key("trash"), self._key("dead"), keys["state"], keys["outcome"]],
            [uuid, self.channel],
        )
        if reply[0] != "ok":
            raise exc.NotFound(f"Job {uuid} is neither trashed nor dead-lettered")
        found = self.get(uuid)
        if found is None:
            raise exc.NotFound(f"Job {uuid} vanished right after being requeued")
        return found

    def register_entity(self, entity: dict[str, Any], ttl_s: float) -> None:
        """SET <ns>:entity:<name> to the entity's JSON for ``ttl_s``."""
        with redis_client.translated(self._where):
            self._client.set(
                self._key("entity", entity["name"]),
                json.dumps(entity),
                px=max(1, int(ttl_s * 1000)),
            )


class RedisJob(job_mod.BoardJob):
    """A job on a :class:`RedisJobBoard` (TaskFlow's class name)."""


class RedisJobBoard(board.LeasedJobBoard):
    """A jobboard on Redis with leased, fenced claims (see the module docstring).

    ``client`` may be an existing ``redis.Redis`` (decode_responses=True; not
    closed by the board); ``persistence`` is where logbooks are loaded from.
    """

    #: TaskFlow's name for the oldest server version the board accepts.
    MIN_REDIS_VERSION = MIN_REDIS_VERSION
    JOB_CLASS = RedisJob

    def __init__(
        self,
        name: str,
        conf: dict[str, Any],
        client: redis_client.TextClient | None = None,
        persistence: Any = None,
    ) -> None:
        layout = compat.board_layout(conf)
        namespace = conf.get("namespace", layout.default_namespace if layout else DEFAULT_NAMESPACE)
        if isinstance(namespace, bytes):
            namespace = namespace.decode("utf-8")
        store_class: Callable[..., RedisStore] = layout.redis_store(conf) if layout else RedisStore
        where = redis_client.describe(conf)
        if client is not None:
            store = store_class(client, str(namespace), where, owns_client=False)
        else:
            store = store_class(
                redis_client.make_client(conf),
                str(namespace),
                where,
                owns_client=True,
                reopen=lambda: redis_client.make_client(conf),
            )
        store.replicas = redis_client.replica_wait(conf, where)
        super().__init__(name, conf, store, persistence=persistence)
        self._namespace = store.namespace

    @property
    def namespace(self) -> str:
        """The prefix of every key this board uses."""
        return self._namespace
