"""A TCP proxy for fault tests: put it between a process and its broker, then break the link.

Each :class:`FaultProxy` listens on a free loopback port and forwards every
connection made to it to one upstream address (a test broker). Point a
worker's URL at the proxy (:meth:`FaultProxy.url`) and the test can, while
the worker runs:

- add latency (:meth:`set_latency`): every chunk of bytes, in each
  direction, is delivered that many seconds after it was read (order kept);
- black-hole the link (:meth:`blackhole`, then :meth:`heal`): nothing is
  delivered either way, and no socket is closed -- not even one the other
  side closed meanwhile -- so neither peer notices anything but silence, as
  in a network partition; what was sent meanwhile is delivered once healed,
  as TCP would after retransmitting;
- cut every connection at once (:meth:`cut`), as a reset would;
- count the connections made through it (:attr:`accepted`), so a test can
  tell that a process reconnected.

All proxies of a test process share one asyncio loop in a daemon thread;
the public methods are thread-safe. Loopback only: nothing here reaches
beyond 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

#: Bytes read at once from a socket.
CHUNK_BYTES = 65536

#: Bound (s) on starting or stopping a proxy, only so a broken loop fails a test.
CONTROL_TIMEOUT_S = 10.0

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The shared event loop (started on first use, in a daemon thread)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="faultproxy", daemon=True).start()
            _LOOP = loop
        return _LOOP


class _Link:
    """One proxied connection: the client's socket and the upstream one."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.aborted = False

    def abort(self) -> None:
        if not self.aborted:
            self.aborted = True
            self.proxy.closed += 1
        for writer in self.writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Forwards 127.0.0.1:<port> to ``upstream`` (host, port), with faults on demand."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        #: Connections accepted so far.
        self.accepted = 0
        #: Connections ended so far, by either peer or by :meth:`cut`.
        self.closed = 0
        self._latency_s = 0.0
        # Set while traffic flows; cleared while black-holed (asyncio, loop thread only).
        self._open: asyncio.Event | None = None
        self._links: set[_Link] = set()
        self._server: asyncio.base_events.Server | None = None

    # --- control (any thread) ---

    def start(self) -> FaultProxy:
        """Listen on a free loopback port (:attr:`port`); returns self."""
        self._call(self._start())
        return self

    def stop(self) -> None:
        """Stop listening and close every connection."""
        self._call(self._stop())

    def url(self, url: str) -> str:
        """``url`` (a broker URL for the upstream) pointed at this proxy instead."""
        parts = urllib.parse.urlsplit(url)
        userinfo, _, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    def set_latency(self, seconds: float) -> None:
        """Deliver every chunk ``seconds`` after it was read, both ways (0: none)."""
        self._latency_s = float(seconds)

    def blackhole(self) -> None:
        """Stop delivering anything, both ways, keeping every socket open."""
        self._call(self._set_open(False))

    def heal(self) -> None:
        """Deliver again (what was held back goes first)."""
        self._call(self._set_open(True))

    def cut(self) -> int:
        """Abort every current connection (both sides see a reset); how many."""
        result: int = self._call(self._cut())
        return result

    @contextlib.contextmanager
    def partitioned(self) -> Iterator[None]:
        """Black-holed for the duration of the block."""
        self.blackhole()
        try:
            yield
        finally:
            self.heal()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, _loop()).result(CONTROL_TIMEOUT_S)

    # --- the loop thread ---

    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut()

    async def _set_open(self, flowing: bool) -> None:
        assert self._open is not None
        if flowing:
            self._open.set()
        else:
            self._open.clear()

    async def _cut(self) -> int:
        links = list(self._links)
        self._links.clear()
        for link in links:
            link.abort()
        return len(links)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(self)
        link.writers.append(writer)
        self._links.add(link)
        assert self._open is not None
        try:
            # A partition also holds back new connections: they stay silent.
            await self._open.wait()
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except (OSError, asyncio.CancelledError):
            link.abort()
            self._links.discard(link)
            return
        link.writers.append(up_writer)
        link.tasks = [
            asyncio.ensure_future(self._pump(reader, up_writer, link)),
            asyncio.ensure_future(self._pump(up_reader, writer, link)),
        ]

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link
    ) -> None:
        """Copy one direction: read as it comes, deliver after the latency and the gate."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        deliver = asyncio.ensure_future(self._deliver(queue, writer, link))
        link.tasks.append(deliver)
        try:
            while True:
                try:
                    data = await reader.read(CHUNK_BYTES)
                except OSError:
                    data = b""
                queue.put_nowait((time.monotonic() + self._latency_s, data))
                if not data:
                    return
        except asyncio.CancelledError:
            deliver.cancel()

    async def _deliver(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter, link: _Link
    ) -> None:
        assert self._open is not None
        try:
            while True:
                due, data = await queue.get()
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._open.wait()
                if not data:  # the sender closed: close the other side too, in order
                    link.abort()
                    self._links.discard(link)
                    return
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            link.abort()
            self._links.discard(link)
        except asyncio.CancelledError:
            pass


@contextlib.contextmanager
def running(upstream_port: int) -> Iterator[FaultProxy]:
    """A started proxy to 127.0.0.1:``upstream_port``, stopped after the block."""
    proxy = FaultProxy(upstream_port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def port_of(url: str) -> int:
    """The TCP port a broker URL names."""
    port = urllib.parse.urlsplit(url).port
    if port is None:
        raise ValueError(f"no port in {url!r}")
    return port
