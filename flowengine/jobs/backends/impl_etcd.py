"""The etcd jobboard (TaskFlow's ``EtcdJobBoard`` name and configuration keys).

Claims are etcd leases kept alive by the board's keeper and fenced by the
revision of the claiming transaction; every change is one etcd transaction;
conductors wake from an etcd watch. The layout and the reasoning are in
:mod:`flowengine.jobs.backends.etcd_store`.

Configuration: ``{'board': 'etcd', ...}`` with TaskFlow's keys ``host``,
``port``, ``protocol``, ``ca_cert``, ``cert_key``, ``cert_cert``,
``timeout``, ``api_path`` (passed to ``etcd3gw``), ``path`` (the board's
place under ``/flowengine/jobs``; default ``jobboard``) and ``ttl`` (the
claim lease in seconds, when ``lease_s`` is not given), or a URL
(``etcd://host:2379?path=x``); plus ``namespace`` (a sub-path, as the other
boards' namespaces) and the policy keys every board takes
(:mod:`flowengine.jobs.board`). Needs the ``etcd`` extra and etcd 3.4 or
newer (its ``/v3`` gateway).
"""

from __future__ import annotations

from typing import Any

from flowengine.jobs import board
from flowengine.jobs import job as job_mod
from flowengine.jobs.backends import etcd_client
from flowengine.jobs.backends.etcd_store import EtcdStore

__all__ = ["EtcdJob", "EtcdJobBoard"]


class EtcdJob(job_mod.BoardJob):
    """A job on an :class:`EtcdJobBoard` (TaskFlow's class name)."""


class EtcdJobBoard(board.LeasedJobBoard):
    """A jobboard in etcd with leased, fenced claims (see the module docstring).

    ``client``: an existing ``etcd3gw.Etcd3Client`` (its session is not
    closed by close()); ``persistence``: where logbooks are loaded from.
    """

    JOB_CLASS = EtcdJob
    #: Where every board's keys live; not TaskFlow's ``/taskflow/jobs``, whose
    #: layout differs, so both boards can share one etcd without meeting.
    ROOT_PATH = "/flowengine/jobs"
    #: The board's place under ROOT_PATH when the configuration names none.
    DEFAULT_PATH = "jobboard"
    #: TaskFlow's connection keys (name, type).
    ETCD_CONFIG_OPTIONS = etcd_client.CONF_KEYS

    def __init__(
        self, name: str, conf: dict[str, Any], client: Any = None, persistence: Any = None
    ) -> None:
        conf = dict(conf)
        if conf.get("ttl") and "lease_s" not in conf:
            conf["lease_s"] = float(conf["ttl"])  # TaskFlow's name for the claim's lifetime
        parts = [self.ROOT_PATH, str(conf.get("path") or self.DEFAULT_PATH).strip("/")]
        if conf.get("namespace"):
            parts.append(str(conf["namespace"]).strip("/"))
        root = "/".join(p for p in parts if p)
        where = (
            f"{conf.get('host') or conf.get('hostname') or 'localhost'}:{conf.get('port') or 2379}"
        )
        store = EtcdStore(
            (lambda: client) if client is not None else (lambda: etcd_client.make_client(conf)),
            root,
            where,
            owns_client=client is None,
        )
        super().__init__(name, conf, store, persistence=persistence)
        self._root_path = root
        self._etcd_store = store

    @property
    def _client(self) -> Any:
        # TaskFlow's name for the board's etcd3gw client (None until connected),
        # which its own etcd tests read.
        return self._etcd_store.client

    def get_one(self, key: str) -> bytes | None:
        """The raw value of any etcd ``key`` (TaskFlow's helper); None if absent."""
        self._store_op()  # JobFailure when not connected
        return self._etcd_store.get_one(key)

    def incr(self, key: str) -> int:
        """Atomically add one to the counter ``key`` (TaskFlow's helper); its new value."""
        self._store_op()  # JobFailure when not connected
        return self._etcd_store.incr(key)

    @property
    def root_path(self) -> str:
        """The key prefix every key of this board starts with."""
        return self._root_path
