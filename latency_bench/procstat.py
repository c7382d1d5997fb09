"""A server process and its children (llama-server) as Linux ``/proc`` sees them: who they are, their memory,
the CPU they have used. The soak run watches memory; the concurrency sweep charges CPU to each answered turn."""

from __future__ import annotations

import os
from pathlib import Path

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the server and its llama-server child)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far, all its threads (not its children)."""
    # the command name (field 2) may hold spaces: the fields after it start past its closing parenthesis
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime: fields 14 and 15 of proc(5)


def cpu_split(pid: int | None) -> dict[str, float] | None:
    """{"server": CPU s of ``pid``, "children": CPU s of its descendants alive now}; None when unreadable."""
    if pid is None:
        return None
    try:
        server = cpu_s(pid)
    except (OSError, ValueError, IndexError):
        return None
    children = 0.0
    for p in tree(pid)[1:]:
        try:
            children += cpu_s(p)
        except (OSError, ValueError, IndexError):
            pass  # a child that ended meanwhile
    return {"server": server, "children": children}
