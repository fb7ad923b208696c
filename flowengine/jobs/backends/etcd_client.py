"""etcd's v3 JSON gateway as the etcd jobboard uses it: transactions, ranges, leases.

The board talks to etcd through ``etcd3gw`` (the client TaskFlow's etcd board
uses) for the HTTP session, the connection keys and leases, and sends its
own transactions: every change of the board is one etcd ``Txn`` whose
compares make it atomic and fenced. Keys and values travel base64-encoded;
revisions come back as decimal strings (int64 in JSON); this module hides both.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from flowengine.utils import optional

try:
    import etcd3gw
    import requests
    from etcd3gw import exceptions as etcd_exc
except ImportError as e:  # the 'etcd' extra is not installed
    raise optional.missing_extra("etcd", e) from e

from flowengine import exceptions as exc

__all__ = ["CONF_KEYS", "EtcdGateway", "Kv", "make_client"]

#: TaskFlow's connection keys of its etcd board and their types (passed to
#: ``etcd3gw.Etcd3Client``).
CONF_KEYS: tuple[tuple[str, type], ...] = (
    ("host", str),
    ("port", int),
    ("protocol", str),
    ("ca_cert", str),
    ("cert_key", str),
    ("cert_cert", str),
    ("timeout", float),
    ("api_path", str),
)
#: Request timeout (s) when the configuration names none: a board must not
#: hang forever on a server that accepted the connection and then stalled.
DEFAULT_TIMEOUT_S = 10.0


def _b64(text: str | bytes) -> str:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def _prefix_end(prefix: str) -> str:
    # Every key starting with ``prefix`` sorts before this one (prefixes
    # here end in '/', so bumping that last character is enough).
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def make_client(conf: dict[str, Any]) -> Any:
    """An ``etcd3gw.Etcd3Client`` from TaskFlow's keys (``hostname`` from a URL too)."""
    kwargs: dict[str, Any] = {}
    for key, kind in CONF_KEYS:
        if conf.get(key) is not None:
            kwargs[key] = kind(conf[key])
    if "host" not in kwargs and conf.get("hostname"):
        kwargs["host"] = str(conf["hostname"])
    kwargs.setdefault("timeout", DEFAULT_TIMEOUT_S)
    return etcd3gw.Etcd3Client(**kwargs)


@dataclass(frozen=True)
class Kv:
    """One key as read: its value and the revisions that fence changes to it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    def json(self) -> dict[str, Any]:
        """The value as a JSON object; JobFailure naming the key if it is not one."""
        try:
            data = json.loads(self.value)
        except ValueError as e:
            raise exc.JobFailure(
                f"etcd key {self.key} does not hold JSON: {self.value[:200]!r}"
            ) from e
        if not isinstance(data, dict):
            raise exc.JobFailure(
                f"etcd key {self.key} does not hold a JSON object: {self.value[:200]!r}"
            )
        return data

    @classmethod
    def from_wire(cls, kv: dict[str, Any]) -> Kv:
        """From the gateway's JSON form of a KeyValue."""
        return cls(
            _unb64(kv.get("key")).decode("utf-8"),
            _unb64(kv.get("value")),
            int(kv.get("create_revision") or 0),
            int(kv.get("mod_revision") or 0),
            int(kv.get("lease") or 0),
        )


class EtcdGateway:
    """Transactions and reads on one etcd through an ``etcd3gw`` client."""

    def __init__(self, client: Any, where: str) -> None:
        self.client = client
        self.where = where

    @contextlib.contextmanager
    def translated(self) -> Iterator[None]:
        """etcd3gw's errors as the board's: unreachable -> BoardUnavailable, else JobFailure."""
        try:
            yield
        except (
            etcd_exc.ConnectionFailedError,
            etcd_exc.ConnectionTimeoutError,
            requests.exceptions.ConnectionError,
            requests.exceptions.Timeout,
        ) as e:
            raise exc.BoardUnavailable(f"etcd at {self.where} is unreachable: {e}", cause=e) from e
        except etcd_exc.Etcd3Exception as e:
            raise exc.JobFailure(f"etcd at {self.where} refused a request: {e}", cause=e) from e

    # Building transactions.

    @staticmethod
    def put(key: str, value: dict[str, Any] | str, lease: int = 0) -> dict[str, Any]:
        """A put request (a dict value is stored as JSON)."""
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        request: dict[str, Any] = {"key": _b64(key), "value": _b64(text)}
        if lease:
            request["lease"] = lease
        return {"request_put": request}

    @staticmethod
    def delete(key: str) -> dict[str, Any]:
        """A delete request of one key."""
        return {"request_delete_range": {"key": _b64(key)}}

    @staticmethod
    def get(key: str, prefix: bool = False) -> dict[str, Any]:
        """A range request of one key, or of every key under ``key`` when ``prefix``."""
        request = {"key": _b64(key)}
        if prefix:
            request["range_end"] = _b64(_prefix_end(key))
        return {"request_range": request}

    @staticmethod
    def revision_is(key: str, mod_revision: int) -> dict[str, Any]:
        """Compare: the key was last changed at ``mod_revision`` (0: it does not exist)."""
        if mod_revision == 0:
            return {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": 0}
        return {"key": _b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": mod_revision}

    # Running them.

    def txn(
        self, compare: Sequence[dict[str, Any]], success: Sequence[dict[str, Any]]
    ) -> tuple[bool, int, list[list[Kv]]]:
        """Run a transaction: (succeeded, its revision, the ranges' results in order)."""
        with self.translated():
            reply = self.client.transaction(
                {"compare": list(compare), "success": list(success), "failure": []}
            )
        ok = bool(reply.get("succeeded"))
        revision = int(reply.get("header", {}).get("revision") or 0)
        ranges = [
            [Kv.from_wire(kv) for kv in r["response_range"].get("kvs", [])]
            for r in reply.get("responses", [])
            if "response_range" in r
        ]
        return ok, revision, ranges

    def read(self, *requests: dict[str, Any]) -> tuple[int, list[list[Kv]]]:
        """Several ranges read at one revision (a snapshot): (revision, results)."""
        _ok, revision, ranges = self.txn([], requests)
        return revision, ranges

    def grant(self, ttl_s: float) -> int:
        """A new lease of ``ttl_s``; its id.

        etcd counts whole seconds (``ttl_s`` is rounded up) and raises a
        shorter TTL to its minimum (2 s with its default timings).
        """
        with self.translated():
            return int(self.client.lease(ttl=max(1, int(-(-ttl_s // 1)))).id)

    def keepalive(self, lease: int) -> bool:
        """Renew a lease to its full TTL; False if it had already expired."""
        with self.translated():
            return bool(etcd3gw.Lease(lease, client=self.client).refresh() > 0)

    def revoke(self, lease: int) -> None:
        """End a lease now (its keys are deleted); a missing lease is no error."""
        with contextlib.suppress(exc.JobFailure), self.translated():
            etcd3gw.Lease(lease, client=self.client).revoke()

    def time_to_live(self, lease: int) -> int:
        """Seconds left on a lease; -1 if it expired."""
        with self.translated():
            return int(etcd3gw.Lease(lease, client=self.client).ttl())

    def version(self) -> str:
        """The server's version (also proves it answers)."""
        with self.translated():
            reply = self.client.session.get(
                self.client.base_url + "/version", timeout=self.client.timeout
            )
        if reply.status_code != 200:
            raise exc.JobFailure(f"etcd at {self.where} answered /version with {reply.status_code}")
        return str(reply.json().get("etcdserver", "?"))
