"""The pending pool of WebRTC calls (``omni_rt.transports.webrtc_admission``): per-client cap (429), pool cap
(503), both in OpenAI's error shape with ``Retry-After``, and places given back. Against a real server:
tests/integration/test_webrtc_admission.py.
"""

from __future__ import annotations

import pytest

from omni_rt.transports.webrtc_admission import PendingCalls
from omni_rt.transports.webrtc_offer import CallError


def test_a_client_gets_its_share_then_429() -> None:
    pool = PendingCalls(max_pending=10, max_per_client=3, connect_timeout_s=4.5)
    for _ in range(3):
        pool.reserve("10.0.0.1")
    with pytest.raises(CallError) as refused:
        pool.reserve("10.0.0.1")
    err = refused.value
    assert err.status == 429 and err.code == "rate_limit_exceeded" and "at most 3" in err.message
    assert err.headers() == {"Retry-After": "5"}
    assert set(err.body()["error"]) == {"type", "code", "message", "param"}
    pool.reserve("10.0.0.2")  # another address is not held back
    assert len(pool) == 4 and pool.held_by("10.0.0.1") == 3
    pool.release("10.0.0.1")
    pool.reserve("10.0.0.1")  # a place given back can be taken again
    assert len(pool) == 4


def test_the_pool_is_bounded_for_everyone() -> None:
    pool = PendingCalls(max_pending=4, max_per_client=3, connect_timeout_s=10)
    for client in ("a", "a", "b", "b"):
        pool.reserve(client)
    with pytest.raises(CallError) as refused:
        pool.reserve("c")
    assert refused.value.status == 503 and refused.value.code == "too_many_pending_calls"
    assert "4 WebRTC calls" in refused.value.message and refused.value.headers() == {"Retry-After": "10"}
    for client in ("a", "a", "b", "b"):
        pool.release(client)
    assert len(pool) == 0 and pool.held_by("a") == 0
    pool.reserve("c")
