"""ZooKeeper backend (``zookeeper://host:port/path``): one znode per record.

TaskFlow's ``impl_zookeeper`` backend by name and configuration: ``hosts``
(``'h1:2181,h2:2181'``, a list, or ``{host: port}``), ``path`` (absolute;
default ``/taskflow``), ``timeout`` (session, seconds), ``check_compatible``
(default True: refuse a server older than :data:`MIN_ZK_VERSION`) and the
other client keys of :func:`flowengine.utils.kazoo_utils.make_client`; or a
URL, ``zookeeper://h1:2181,h2:2181/path?timeout=5``. Needs the
``zookeeper`` extra.

The layout is :mod:`flowengine.persistence.path_based`'s: a record is the
JSON data of its znode, a link is an empty child znode named after the
record it points to. Every write of one call (a logbook with its flow and
atom details) is one ZooKeeper ``multi`` transaction: all of it or nothing.

Fenced writes (:mod:`flowengine.persistence.fencing`): the fence is a
znode under ``<path>/fences``; a fenced write adds a version check of that
znode (or its creation, when there is none yet) to its own transaction, so
a newer claimer's advance between the check and the write makes the write
fail, atomically, on the server.
"""

from __future__ import annotations

import contextlib
import functools
import json
import posixpath
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from flowengine.utils import kazoo_tls, kazoo_utils, optional

try:
    from kazoo import exceptions as k_exc
    from kazoo.client import KazooClient
except ImportError as e:  # the 'zookeeper' extra is not installed
    raise optional.missing_extra("zookeeper", e) from e

from flowengine import exceptions as exc
from flowengine.persistence import base, fencing, path_based
from flowengine.persistence.backends import json_codec

__all__ = ["MIN_ZK_VERSION", "ZkBackend", "ZkConnection"]

#: Oldest ZooKeeper server accepted (TaskFlow's value): multi-op transactions.
MIN_ZK_VERSION = (3, 4, 0)
#: How long get_connection() waits for the first session before giving up:
#: a reachable server answers in milliseconds; a dead one should fail fast.
CONNECT_TIMEOUT_S = 15.0
_KIND_OF_DIR = {"books": "LogBook", "flow_details": "FlowDetail", "atom_details": "AtomDetail"}
#: Fence advances retried when another claimer moved the fence in between.
ADVANCE_ATTEMPTS = 5
#: How long a call waits for its client to reconnect (to another node of the
#: ensemble, after a leader loss or a node's death) before StorageFailure: an
#: election takes a second or two, and a session outlives it by its timeout.
RECONNECT_WAIT_S = 15.0
#: Pauses between tries while reconnecting: doubled from the first to the last.
RECONNECT_FIRST_PAUSE_S = 0.05
RECONNECT_MAX_PAUSE_S = 0.5
#: Bound on one request's round trip (as the ZooKeeper board's): kazoo's
#: synchronous calls wait for an answer without a bound, and a request lost
#: in a reconnection would hold its caller (a conductor's job) for ever. A
#: request that timed out counts as a lost connection: made again once
#: reconnected (a multi, less what it may have applied: see _commit).
OP_TIMEOUT_S = 10.0
#: Errors after which the same call is worth making again once reconnected.
_RECONNECTABLE = (k_exc.ConnectionLoss, k_exc.OperationTimeoutError, k_exc.SessionExpiredError)
_T = TypeVar("_T")


class ZkBackend(path_based.PathBasedBackend):
    """Keeps logbooks, flow and atom details in ZooKeeper under ``path``.

    ``client``: an existing kazoo client (started or not) to use instead of
    making one from ``conf``; it is not stopped by close(). ValueError for
    a relative path; StorageFailure when the server cannot be reached.
    """

    DEFAULT_PATH = "/taskflow"

    def __init__(
        self, conf: dict[str, Any] | None = None, client: KazooClient | None = None
    ) -> None:
        conf = dict(conf or {})
        url = conf.get("connection")
        if isinstance(url, str) and url.lower().startswith("zookeeper:"):
            conf = kazoo_utils.conf_from_url(url, conf)
        super().__init__(conf)
        if not isinstance(self._path, str) or not posixpath.isabs(self._path):
            raise ValueError(f"Zookeeper path must be absolute, not {self._path!r}")
        self._owned = client is None
        self._client = client if client is not None else kazoo_utils.make_client(self._conf)
        self._validated = False
        self._start_lock = threading.Lock()

    @property
    def client(self) -> KazooClient:
        """The kazoo client this backend uses."""
        return self._client

    def _started(self) -> KazooClient:
        with self._start_lock:
            if not self._client.connected:
                # A wrong CA or refused certificate fails now, not as an
                # unreachable server after kazoo's retries (see kazoo_tls).
                problem = kazoo_tls.tls_problem(self._client)
                if problem is not None:
                    raise exc.StorageFailure(problem)
                try:
                    # Not client.start(): the client may be running, between
                    # two nodes of the ensemble (see start_or_await).
                    kazoo_utils.start_or_await(self._client, CONNECT_TIMEOUT_S)
                except (
                    k_exc.KazooException,
                    k_exc.ZookeeperError,
                    self._client.handler.timeout_exception,
                ) as e:
                    raise exc.StorageFailure(
                        f"ZooKeeper at {self._client.hosts} is unreachable: {e}", cause=e
                    ) from e
        return self._client

    def get_connection(self) -> ZkConnection:
        """A connection (starts the client; validates the server once)."""
        conn = ZkConnection(self, self._started())
        if not self._validated:
            conn.validate()
            self._validated = True
        return conn

    def fenced_connection(self, fence: fencing.Fence) -> base.Connection:
        """A connection whose writes are refused once ``fence`` is superseded (see module doc)."""
        return ZkFencedConnection(self.get_connection(), fence)

    def close(self) -> None:
        """Stop and close the client if this backend made it."""
        self._validated = False
        if self._owned:
            try:
                kazoo_utils.finalize_client(self._client)
            except (k_exc.KazooException, k_exc.ZookeeperError) as e:
                raise exc.StorageFailure(
                    f"Unable to finalize the ZooKeeper client: {e}", cause=e
                ) from e


class ZkConnection(path_based.PathBasedConnection):
    """A connection to a :class:`ZkBackend` (shares its client)."""

    def __init__(self, backend: ZkBackend, client: KazooClient) -> None:
        super().__init__(backend)
        self._zk_backend = backend
        self._client = client
        # The transaction under way in this thread: nested writes (a fenced
        # write wrapping a logbook save) join it and commit once, together.
        self._local = threading.local()

    @property
    def backend(self) -> ZkBackend:
        """The backend this connection belongs to."""
        return self._zk_backend

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """kazoo's errors as flowengine's (kazoo's own never leak)."""
        try:
            yield
        except k_exc.NoNodeError as e:
            raise exc.NotFound(f"Storage backend node not found: {e}", cause=e) from e
        except k_exc.NodeExistsError as e:
            raise exc.Duplicate(f"Storage backend duplicate node: {e}", cause=e) from e
        except k_exc.SessionExpiredError as e:
            raise exc.StorageFailure(f"Storage backend session has expired: {e}", cause=e) from e
        except self._client.handler.timeout_exception as e:
            raise exc.StorageFailure(f"Storage backend timeout: {e}", cause=e) from e
        except (k_exc.KazooException, k_exc.ZookeeperError) as e:
            raise exc.StorageFailure(f"Storage backend internal error: {e}", cause=e) from e

    def _join_path(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def _get_item(self, path: str) -> Any:
        return self._get_versioned(path)[0]

    def _get_versioned(self, path: str) -> tuple[Any, int]:
        """The JSON value at ``path`` and its znode's version (NotFound if none)."""
        with self._errors():
            data, stat = self._riding_out(lambda: self._answer(self._client.get_async(path)))
        return json_codec.decode(data.decode("utf-8", "replace"), f"znode {path!r}"), stat.version

    def _exists(self, path: str) -> bool:
        with self._errors():
            return (
                self._riding_out(lambda: self._answer(self._client.exists_async(path))) is not None
            )

    @staticmethod
    def _encode(path: str, value: Any) -> bytes:
        """JSON bytes; SerializationFailure naming the record and field that cannot be."""
        kind = _KIND_OF_DIR.get(posixpath.basename(posixpath.dirname(path)), "record")
        record = value.get("atom", value) if isinstance(value, dict) else {}
        what = json_codec.describe(record, kind) if isinstance(record, dict) else path
        if isinstance(value, dict) and set(value) == {"atom", "type"}:
            # The atom first, so that an error names its field.
            atom = json_codec.encode(value["atom"], what)
            kind_text = json_codec.encode_field(value["type"], what, "type")
            return ('{"atom":' + atom + ',"type":' + kind_text + "}").encode("utf-8")
        return json_codec.encode(value, what).encode("utf-8")

    def _set_item(self, path: str, value: Any, transaction: Any) -> None:
        data = self._encode(path, value)  # before anything is sent
        if self._exists(path):
            transaction.set_data(path, data)
        else:
            transaction.create(path, data)

    def _del_tree(self, path: str, transaction: Any) -> None:
        try:
            children = self._get_children(path)
        except exc.NotFound:
            return
        for child in children:
            self._del_tree(self._join_path(path, child), transaction)
        transaction.delete(path)

    def _get_children(self, path: str) -> list[str]:
        with self._errors():
            return sorted(
                self._riding_out(lambda: self._answer(self._client.get_children_async(path)))
            )

    def _ensure_path(self, path: str) -> None:
        with self._errors():
            # kazoo's stubs lack ensure_path_async: made once, at upgrade().
            self._riding_out(lambda: self._client.ensure_path(path))

    def _create_link(self, src_path: str, dest_path: str, transaction: Any) -> None:
        if not self._exists(dest_path):
            transaction.create(dest_path)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        current = getattr(self._local, "txn", None)
        if current is not None:  # nested: the outermost commits
            yield current
            return
        txn = self._client.transaction()
        self._local.txn = txn
        try:
            with self._errors():
                yield txn
                self._commit(txn)
        except kazoo_utils.KazooTransactionException as e:
            raise exc.StorageFailure(f"Storage backend transaction failed: {e}", cause=e) from e
        finally:
            self._local.txn = None

    def _answer(self, pending: Any) -> Any:
        """The answer to a request in flight, within OP_TIMEOUT_S (else OperationTimeoutError)."""
        return kazoo_utils.answer_within(self._client, pending, OP_TIMEOUT_S)

    def _riding_out(self, call: Callable[[], _T]) -> _T:
        """``call()``, made again while the client reconnects (up to RECONNECT_WAIT_S).

        A leader loss or the death of the client's node fails the requests in
        flight (ConnectionLoss); kazoo reconnects to another node of the
        ensemble, where the same request succeeds. A call still failing at
        the deadline raises its error.
        """
        deadline = time.monotonic() + RECONNECT_WAIT_S
        pause = RECONNECT_FIRST_PAUSE_S
        while True:
            try:
                return call()
            except _RECONNECTABLE:
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)  # kazoo is reconnecting meanwhile
                pause = min(pause * 2, RECONNECT_MAX_PAUSE_S)

    def _commit(self, txn: Any) -> None:
        """Commit ``txn``; if the connection dropped meanwhile, commit what it had left to do.

        A multi cut off by a connection loss may or may not have been applied:
        once reconnected, :meth:`_remaining` rebuilds it from what the
        ensemble holds, so that it takes effect once, whichever it was.
        """
        current = [txn]
        unsure = [False]

        def attempt() -> None:
            if unsure[0]:
                current[0] = self._remaining(current[0].operations)
            try:
                kazoo_utils.checked_commit(current[0], timeout_s=OP_TIMEOUT_S)
            except _RECONNECTABLE:
                unsure[0] = True
                raise

        self._riding_out(attempt)

    def _remaining(self, operations: list[Any]) -> Any:
        """A transaction of ``operations`` less those a multi cut off may have applied.

        A create whose znode now holds the same data was applied (a znode of
        other data is left to fail the create, as it would have); a delete
        of a znode that is gone was applied. Data writes without a version
        and version checks are idempotent, and stay.
        """
        txn = self._client.transaction()
        for op in operations:
            path = self._client.unchroot(op.path)
            kind = type(op).__name__
            if kind in ("Create", "Create2"):
                try:
                    data, _stat = self._answer(self._client.get_async(path))
                except k_exc.NoNodeError:
                    txn.create(path, op.data)
                    continue
                if data != op.data:
                    txn.create(path, op.data)  # someone else's: fails as it would have
            elif kind == "Delete":
                if self._answer(self._client.exists_async(path)) is not None:
                    txn.delete(path, op.version)
            elif kind == "SetData":
                txn.set_data(path, op.data, op.version)
            elif kind == "CheckVersion":
                txn.check(path, op.version)
            else:  # not one this backend makes
                raise exc.StorageFailure(f"Cannot replay a {kind} on {path!r}")
        return txn

    def validate(self) -> None:
        """StorageFailure unless the server is at least MIN_ZK_VERSION (when checked)."""
        check = self.backend.conf.get("check_compatible", True)
        if isinstance(check, str):
            check = check.strip().lower() in ("1", "t", "true", "on", "y", "yes")
        if not check:
            return
        with self._errors():
            try:
                kazoo_utils.check_compatible(self._client, MIN_ZK_VERSION)
            except exc.IncompatibleVersion as e:
                raise exc.StorageFailure(
                    f"Backend storage is not a compatible version: {e}", cause=e
                ) from e


class ZkFencedConnection(fencing.PathFencedConnection):
    """Fenced writes on ZooKeeper: the fence's version is checked in the write's own multi."""

    def __init__(self, conn: ZkConnection, fence: fencing.Fence) -> None:
        super().__init__(conn, fence)
        self._zk = conn

    def _read_fence(self) -> tuple[int | None, int]:
        """(stored token or None, znode version or -1 when there is no fence yet)."""
        try:
            value, version = self._zk._get_versioned(self._path)
        except exc.NotFound:
            return None, -1
        try:
            return int(value["token"]), version
        except (KeyError, TypeError, ValueError) as e:
            raise exc.StorageFailure(f"Fence {self._path} is unreadable: {e}") from e

    def _ours(self) -> bytes:
        return json.dumps({"token": self._fence.token}).encode("utf-8")

    @contextlib.contextmanager
    def _fenced(self) -> Iterator[Any]:
        with self._zk._transaction() as txn:
            stored, version = self._read_fence()
            self._fence.check(stored)
            if version < 0:  # nobody fenced it yet: claim it in this very multi
                self._zk._ensure_path(posixpath.dirname(self._path))
                txn.create(self._path, self._ours())
            else:  # fails the multi if a newer claimer advanced it meanwhile
                txn.check(self._path, version)
            yield txn

    def _write(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._write(method, *args, **kwargs)
        except exc.FencedOut:
            raise
        except exc.StorageFailure as e:
            # The multi failed: if a newer claimer advanced the fence between
            # our check and the commit, say so (that is what failed it).
            stored, _version = self._read_fence()
            self._fence.check(stored)
            raise e

    def _raise_to_ours(self, version: int) -> None:
        """Write our token over the fence of ``version`` (-1: create it)."""
        if version < 0:
            self._zk._client.create(self._path, self._ours())
        else:
            self._zk._client.set(self._path, self._ours(), version=version)

    def advance_fence(self) -> None:
        """Raise the fence to our token (FencedOut if a newer one is there), atomically."""
        self._zk._ensure_path(posixpath.dirname(self._path))
        for _ in range(ADVANCE_ATTEMPTS):
            stored, version = self._read_fence()
            self._fence.check(stored)
            if stored == self._fence.token:
                return
            try:
                # Made again across a reconnection: a write that was applied
                # before its answer was lost then fails as Duplicate or
                # BadVersion, and the next look finds our token there.
                with self._zk._errors():
                    self._zk._riding_out(functools.partial(self._raise_to_ours, version))
                return
            except exc.Duplicate:
                continue  # another claimer (or our own cut-off try) created it: look again
            except exc.StorageFailure as e:
                if isinstance(e.cause, k_exc.BadVersionError):
                    continue  # moved meanwhile: look again
                raise
        raise exc.StorageFailure(
            f"Fence {self._path} kept moving: gave up advancing it after"
            f" {ADVANCE_ATTEMPTS} attempts"
        )
