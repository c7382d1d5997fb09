"""Connection headroom (issues 26.3 and 27.5): the connection cap and accept backlog that the open-file limit
leaves. The guard on real servers: tests/integration/test_server_connections.py.
"""

from __future__ import annotations

from omni_rt.server.connections import FD_RESERVE, REFUSE_ROOM, accept_backlog, connection_cap


def test_cap_is_what_the_file_limit_leaves() -> None:
    # 256 files, 22 open after loading the CPU preset (measured), 8 sessions: 256 - 22 - 32 (backlog) - 32 - 16 - 8
    assert accept_backlog(256) == 32
    assert connection_cap(256, 22, 8) == 256 - 22 - 32 - FD_RESERVE - 2 * 8 - REFUSE_ROOM == 146
    assert connection_cap(256, 22, 8, configured=100) == 100  # a configured value only lowers it
    assert connection_cap(256, 22, 8, configured=1000) == 146
    assert connection_cap(64, 40, 32) == 4  # a hopeless limit still serves a few (and the log says so)
    assert accept_backlog(1 << 20) == 2048
