"""Unfinished connections against a real `omni-rt serve` (127.0.0.1, a 200-file limit: a cap near 96): under
the cap each lives until its header deadline (5 s) and is closed then, none evicted early; over the cap the
oldest unfinished ones make room at once and /healthz still answers."""

from __future__ import annotations

import select
import socket
import time

import httpx
import pytest
from servers import start_server, stop_server

pytestmark = pytest.mark.integration

NOFILE = 200
DEADLINE_S = 5.0


@pytest.fixture(scope="module")
def fd200_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("fd200"), "--max-sessions", "8", nofile=NOFILE)
    yield server
    stop_server(server)


def metric(server, name: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{server.http_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def lifetimes(socks: list[socket.socket], born: dict[socket.socket, float], limit_s: float) -> dict[socket.socket, float]:
    """Seconds from each socket's connect to the server closing it (bounded wait)."""
    life: dict[socket.socket, float] = {}
    end = time.monotonic() + limit_s
    while len(life) < len(socks) and time.monotonic() < end:
        ready, _, _ = select.select([s for s in socks if s not in life], [], [], 0.1)
        for s in ready:
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:
                life[s] = time.monotonic() - born[s]
    return life


def test_unfinished_connections_under_the_cap_live_until_their_deadline(fd200_server) -> None:
    port = int(fd200_server.http_url.rsplit(":", 1)[1])
    cap = int(metric(fd200_server, "omni_rt_connection_cap")["omni_rt_connection_cap"])
    n = min(80, cap - 12)  # well under the cap: the guard has no reason to close anything early
    assert n >= 40, cap
    before = metric(fd200_server, "omni_rt_tcp_connections_total")
    socks, born = [], {}
    try:
        for i in range(n):  # half silent, half with headers started and never finished
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            born[s] = time.monotonic()
            if i % 2:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(s)
        assert httpx.get(f"{fd200_server.http_url}/healthz", timeout=5).status_code == 200
        life = lifetimes(socks, born, DEADLINE_S + 5)
    finally:
        for s in socks:
            s.close()
    assert len(life) == n, f"{n - len(life)} unfinished connections outlived their deadline"
    early = sorted(t for t in life.values() if t < DEADLINE_S - 0.5)
    assert not early, f"{len(early)} closed before the {DEADLINE_S} s header deadline: {early[:5]}"
    assert max(life.values()) < DEADLINE_S + 2.0, max(life.values())
    after = metric(fd200_server, "omni_rt_tcp_connections_total")
    evicted = 'omni_rt_tcp_connections_total{outcome="evicted"}'
    timed_out = 'omni_rt_tcp_connections_total{outcome="timed_out"}'
    assert after.get(evicted, 0) == before.get(evicted, 0), (before, after)
    assert after.get(timed_out, 0) - before.get(timed_out, 0) >= n, (before, after)


def test_over_the_cap_the_oldest_make_room(fd200_server) -> None:
    port = int(fd200_server.http_url.rsplit(":", 1)[1])
    cap = int(metric(fd200_server, "omni_rt_connection_cap")["omni_rt_connection_cap"])
    before = metric(fd200_server, "omni_rt_tcp_connections_total")
    socks, born = [], {}
    try:
        for _ in range(cap + 10):  # real pressure: more unfinished connections than the cap
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            born[s] = time.monotonic()
            socks.append(s)
        t0 = time.monotonic()
        assert httpx.get(f"{fd200_server.http_url}/healthz", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 3.0
        life = lifetimes(socks[:5], born, DEADLINE_S + 5)
        assert len(life) == 5 and min(life.values()) < DEADLINE_S, life  # the oldest were closed to make room
    finally:
        for s in socks:
            s.close()
    after = metric(fd200_server, "omni_rt_tcp_connections_total")
    evicted = 'omni_rt_tcp_connections_total{outcome="evicted"}'
    assert after.get(evicted, 0) - before.get(evicted, 0) >= 10, (before, after)
