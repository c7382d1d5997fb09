"""A WebSocket close reason always fits the close frame (at most 123 bytes, no NUL). Hostile input against a
real server: tests/integration/test_server_faults.py.
"""

from __future__ import annotations


def test_close_reasons_fit_the_frame() -> None:
    from omni_rt.transports.websocket import safe_reason

    reason = safe_reason("origin not allowed: " + "ö" * 400 + "\x00")
    assert len(reason.encode()) <= 123 and "\x00" not in reason
