"""The fault proxy itself: forwarding, latency, black-hole and heal, cut, counting.

Against a small echo server on loopback (the proxy knows nothing of brokers).
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tests import faultproxy
from tests.reliability.worker_procs import wait_until

#: Bounded waits (s): long enough for a loaded machine, only to fail instead of hang.
RECV_TIMEOUT_S = 10.0

#: How long the test listens for bytes that must not come (a black-holed link).
SILENCE_S = 0.3


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while True:
            try:
                data = self.request.recv(4096)
            except OSError:
                return
            if not data:
                return
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _client(proxy: faultproxy.FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=RECV_TIMEOUT_S)
    return sock


def _echo(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_forwards_and_counts_connections(echo_port):
    with faultproxy.running(echo_port) as proxy:
        with _client(proxy) as a, _client(proxy) as b:
            assert _echo(a, b"hello") == b"hello"
            assert _echo(b, b"world") == b"world"
            assert proxy.closed == 0
        assert proxy.accepted == 2
        # Both clients closed: the proxy sees each connection end, once.
        wait_until(lambda: proxy.closed == 2, what="both connections counted closed")


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_latency_delays_each_direction(echo_port):
    with faultproxy.running(echo_port) as proxy:
        proxy.set_latency(0.1)
        with _client(proxy) as sock:
            started = time.monotonic()
            assert _echo(sock, b"x") == b"x"
            # Two delayed deliveries (there and back): a lower bound, by construction.
            assert time.monotonic() - started >= 0.2


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_blackhole_holds_traffic_without_closing_then_heals(echo_port):
    with faultproxy.running(echo_port) as proxy:
        with _client(proxy) as sock:
            assert _echo(sock, b"a") == b"a"
            # Given a black-holed link
            proxy.blackhole()
            sock.sendall(b"held")
            # Then nothing comes back, and the socket is not closed either
            sock.settimeout(SILENCE_S)
            with pytest.raises(socket.timeout):
                sock.recv(16)
            # When the link heals, what was sent meanwhile arrives
            proxy.heal()
            sock.settimeout(RECV_TIMEOUT_S)
            assert sock.recv(16) == b"held"


@pytest.mark.slow  # half a second or more: out of the fast tier (tests/fast_tier.py)
def test_cut_resets_every_connection(echo_port):
    with faultproxy.running(echo_port) as proxy:
        with _client(proxy) as sock:
            assert _echo(sock, b"a") == b"a"
            assert proxy.cut() == 1
            try:
                data = sock.recv(16)
            except ConnectionResetError:
                data = b""
            assert data == b""


def test_url_points_at_the_proxy():
    proxy = faultproxy.FaultProxy(5672)
    proxy.port = 40000
    assert proxy.url("amqp://guest:pw@127.0.0.1:5672//") == "amqp://guest:pw@127.0.0.1:40000//"
    assert proxy.url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:40000/0"
    assert faultproxy.port_of("redis://127.0.0.1:6379/0") == 6379
