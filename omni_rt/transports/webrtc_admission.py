"""Admission of WebRTC calls that have not connected yet: a bounded pool of pending calls, capped per client.

An offer (``POST /v1/realtime/calls``) costs the client one HTTP request; answering it costs the server a peer
connection, its UDP sockets and ICE checks. If every answered offer held a session slot until the peer connected
(or was given up), a few offers a second that never complete ICE would keep ``max_sessions`` full and refuse every
real client. So an answered call is *pending*: it holds a place in this pool, not a session, until its media or
data channel is up (``omni_rt.transports.webrtc.Call`` then takes a session slot, or closes if the server is full),
and it is freed when ICE fails or its connect deadline passes.

The pool is bounded (``webrtc_max_pending_calls``: 503 ``too_many_pending_calls`` when full) and so is each
client's share of it (``webrtc_max_pending_per_client``, by source IP, loopback included: 429
``rate_limit_exceeded``), so one address cannot take the whole pool. Both refusals carry ``Retry-After``: the
connect deadline, by which every pending call has connected or been freed.
"""

from __future__ import annotations

import math
from collections import Counter

from omni_rt.transports.webrtc_offer import CallError


class PendingCalls:
    """Places for calls answered but not yet connected: how many in all, and how many per client address."""

    def __init__(self, max_pending: int, max_per_client: int, connect_timeout_s: float) -> None:
        self.max_pending = max_pending
        self.max_per_client = max_per_client
        self.connect_timeout_s = connect_timeout_s
        self._by_client: Counter[str] = Counter()
        self._total = 0

    def __len__(self) -> int:
        return self._total

    def held_by(self, client: str) -> int:
        return self._by_client.get(client, 0)

    def retry_after(self) -> str:
        return str(max(1, math.ceil(self.connect_timeout_s)))

    def reserve(self, client: str) -> None:
        """Take a place for a call from ``client`` (its IP address), or raise the ``CallError`` saying why not."""
        if self._by_client[client] >= self.max_per_client:
            raise CallError(429, "rate_limit_exceeded", f"too many WebRTC calls from this address are waiting to "
                            f"connect: at most {self.max_per_client} at a time; connect them or wait "
                            f"{self.retry_after()} s", type="requests", retry_after=self.retry_after())
        if self._total >= self.max_pending:
            raise CallError(503, "too_many_pending_calls", f"server busy: {self.max_pending} WebRTC calls are "
                            f"waiting to connect; retry in {self.retry_after()} s", type="server_error",
                            retry_after=self.retry_after())
        self._by_client[client] += 1
        self._total += 1

    def release(self, client: str) -> None:
        """Give back the place ``reserve`` took (the call connected, failed or was given up)."""
        if self._by_client[client] <= 1:
            self._by_client.pop(client, None)
        else:
            self._by_client[client] -= 1
        self._total = max(0, self._total - 1)
