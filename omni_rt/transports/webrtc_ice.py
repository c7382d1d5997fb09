"""Where a WebRTC call's ICE sockets bind, on which UDP ports, and which address they advertise.

Server settings ``webrtc_hosts``, ``webrtc_advertise_address`` and ``webrtc_port_min``/``webrtc_port_max``
(``IceConfig.from_settings``); the aiortc clients of the tests and the bench use ``LOOPBACK``.

aiortc 1.16 / aioice 0.13 have no option for any of the three: aiortc builds each aioice ``Connection`` itself,
and ``Connection.gather_candidates`` binds one UDP socket, on a port the kernel picks, on every interface address
``aioice.ice.get_host_addresses`` returns (every one but loopback). So ``restrict_gathering`` replaces, on each
of a peer connection's ICE connections, the one method the gathering calls,
``get_component_candidates(component, addresses)``: it passes the configured addresses instead of the gathered
ones (or binds them in the port range itself, as aioice binds a host candidate), then rewrites the advertised
address. Checks, nomination, consent and TURN stay aioice's. With no setting given nothing is replaced.

A server whose ``webrtc_hosts`` are all loopback (``--webrtc-host 127.0.0.1``) takes datagrams from loopback
addresses only (``loopback_peers_only``): a browser pairs each of its local addresses with our 127.0.0.1
candidate, and Linux delivers 192.0.2.2 -> 127.0.0.1, so without it a call meant to stay on the loopback would
answer (and could nominate) a peer-reflexive pair on another address.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import logging
import random
import socket
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("omni_rt.webrtc")


class GatherError(OSError):
    """No host candidate could be bound (every port of the range taken, or no configured address is local)."""


@dataclass(frozen=True)
class IceConfig:
    hosts: tuple[str, ...] = ()  # addresses to bind and offer; () = aioice's own (every interface but loopback)
    advertise: str | None = None  # offered instead of the bound address (a 1:1 NAT's public address)
    ports: tuple[int, int] | None = None  # UDP port range, both ends included; None = any port the kernel picks
    loopback_peers_only: bool = False  # sockets bound to a loopback address drop datagrams from other addresses

    @property
    def default(self) -> bool:
        return not self.hosts and self.advertise is None and self.ports is None

    @classmethod
    def from_settings(cls, settings: Any) -> "IceConfig":
        low, high = getattr(settings, "webrtc_port_min", None), getattr(settings, "webrtc_port_max", None)
        hosts = tuple(getattr(settings, "webrtc_hosts", None) or ())
        return cls(hosts, getattr(settings, "webrtc_advertise_address", None),
                   (low, high) if low is not None and high is not None else None,
                   loopback_peers_only=bool(hosts) and all(ipaddress.ip_address(h).is_loopback for h in hosts))


LOOPBACK = IceConfig(hosts=("127.0.0.1",))


def ice_connections(pc: Any) -> list[Any]:
    """The aioice ``Connection`` of each ICE transport ``pc`` has now (one when audio and data are bundled)."""
    dtls = [t.receiver.transport for t in pc.getTransceivers()] + ([pc.sctp.transport] if pc.sctp is not None else [])
    found = {id(c): c for c in (d.transport.iceGatherer._connection for d in dtls if d is not None)}
    return list(found.values())


def restrict_gathering(pc: Any, config: IceConfig) -> None:
    """Apply ``config`` to ``pc``'s ICE: call it once its transceivers and data channel exist (an offerer after
    ``addTrack``/``createDataChannel``, an answerer after ``setRemoteDescription``) and before
    ``setLocalDescription``, which gathers. ``setLocalDescription`` then raises ``GatherError`` when no address
    could be bound."""
    if config.default:
        return
    for conn in ice_connections(pc):
        if not getattr(conn, "_omni_rt_ice", False):
            conn._omni_rt_ice = True
            conn.get_component_candidates = functools.partial(_component_candidates, conn, conn.get_component_candidates, config)


async def _component_candidates(conn: Any, gather: Any, config: IceConfig, component: int, addresses: list[str],
                                timeout: int = 5) -> list[Any]:
    hosts = list(config.hosts) or addresses
    before = len(conn._protocols)
    if config.ports is None:
        candidates = await gather(component=component, addresses=hosts, timeout=timeout)
    else:  # aioice binds port 0: bind in the range here; then aioice adds what it adds without host sockets (TURN)
        bound = [c for c in [await _bind_in_range(conn, component, host, config.ports) for host in hosts] if c is not None]
        candidates = bound + await gather(component=component, addresses=[], timeout=timeout)
    hosted = [c for c in candidates if c.type == "host"]
    if (config.hosts or config.ports) and not hosted:
        where = f" in UDP ports {config.ports[0]}-{config.ports[1]}" if config.ports else ""
        raise GatherError(errno.EADDRNOTAVAIL, f"no WebRTC socket could be bound on {', '.join(hosts)}{where}")
    for protocol in conn._protocols[before:] if config.loopback_peers_only else ():
        local = getattr(protocol, "local_candidate", None)
        if local is not None and local.type == "host" and ipaddress.ip_address(local.host).is_loopback:
            protocol.datagram_received = functools.partial(_from_loopback_only, protocol.datagram_received)
    if config.advertise is not None:
        version = ipaddress.ip_address(config.advertise).version
        for candidate in hosted:  # the socket stays bound where it is; the SDP names the public address
            if ipaddress.ip_address(candidate.host).version == version:
                candidate.host = config.advertise
    return candidates


def _from_loopback_only(receive: Any, data: bytes, addr: tuple[Any, ...]) -> None:
    if ipaddress.ip_address(addr[0]).is_loopback:
        receive(data, addr)


async def _bind_in_range(conn: Any, component: int, host: str, ports: tuple[int, int]) -> Any:
    """One host candidate on ``host``, on a free port of the range (tried from a random one on), built as
    ``aioice.Connection.get_component_candidates`` builds it; None when none is free or ``host`` is not local."""
    from aioice import turn
    from aioice.candidate import Candidate, candidate_foundation, candidate_priority
    from aioice.ice import StunProtocol

    loop = asyncio.get_running_loop()
    low, high = ports
    count = high - low + 1
    first = random.randrange(count)
    for i in range(count):
        try:
            transport, protocol = await loop.create_datagram_endpoint(
                lambda: StunProtocol(conn), local_addr=(host, low + (first + i) % count))
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                log.info("webrtc: could not bind %s: %s", host, exc)
                return None
    else:
        log.warning("webrtc: every UDP port %d-%d on %s is taken", low, high, host)
        return None
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, turn.UDP_SOCKET_BUFFER_SIZE)
    address = transport.get_extra_info("sockname")
    protocol.local_candidate = Candidate(
        foundation=candidate_foundation("host", "udp", address[0]), component=component, transport="udp",
        priority=candidate_priority(component, "host"), host=address[0], port=address[1], type="host")
    conn._protocols.append(protocol)
    return protocol.local_candidate
