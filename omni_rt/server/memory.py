"""Hand freed memory back to the operating system when the server goes idle.

Long answers make CPython, torch, onnxruntime and the tokenizers allocate and free large buffers through
glibc's ``malloc``. Freed chunks stay in malloc's arenas (the main heap and one arena per thread that
allocated) for reuse, so the server's RSS rises over the first long turns and does not come down when the
sessions close. ``malloc_trim(0)`` walks every arena and gives whole free pages back (``madvise`` on free
pages inside a heap, ``sbrk`` at its top); a ``gc.collect()`` first frees what reference cycles still hold.
Before that the stages hand back their own pools (``Scheduler.release_memory``): onnxruntime's CPU arenas keep
the peak of every run (Piper's, for a long sentence or several voices at once: hundreds of MB) until a run asks
them to shrink.

When: only once the last open session has closed. A trim takes each arena's lock in turn; run while answers
stream it could stall an allocation in the middle of a decode step, and an idle server has nobody to stall.
At most one trim runs at a time, in a worker thread (on a heap of several hundred MB it takes milliseconds),
and not more often than ``min_interval_s``: a client that connects and leaves in a loop does not make the
server trim in a loop. Where the C library has no ``malloc_trim`` (musl, macOS) nothing is done and the
state says so.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("omni_rt.memory")


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def rss_mb() -> float | None:
    """This process's resident set (MB), from ``/proc`` (None off Linux)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return None if kb is None else round(kb / 1024, 1)


class IdleMemoryRelease:
    """Call it when the last session closes: it trims malloc's arenas in a worker thread (see the module).

    ``idle``: whether the server is still idle when the trim is due (a session that opened meanwhile defers it
    to that session's close). Calls within ``min_interval_s`` of the last trim are folded into one trim at
    the end of the interval, so the last close is always followed by a trim.
    """

    def __init__(self, idle: Callable[[], bool] = lambda: True, min_interval_s: float = 2.0,
                 release_caches: Callable[[], None] | None = None) -> None:
        self.min_interval_s = min_interval_s
        self._idle = idle
        self._release_caches = release_caches  # the stages' own pools first (e.g. onnxruntime arenas)
        self._trim = _malloc_trim()
        self._pending = False
        self._last = float("-inf")
        self.releases = 0
        self.last: dict[str, Any] = {}

    def __call__(self) -> None:
        if self._trim is None or self._pending:
            return
        self._pending = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a direct call): trim here
            self._release()
            return
        loop.call_later(max(0.0, self._last + self.min_interval_s - time.monotonic()), self._start, loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._idle():
            self._pending = False
            return
        loop.run_in_executor(None, self._release)

    def _release(self) -> None:
        try:
            before = rss_mb()
            t0 = time.perf_counter()
            if self._release_caches is not None:
                self._release_caches()
            gc.collect()
            self._trim(0)
            after = rss_mb()
            self.releases += 1
            self.last = {"rss_before_mb": before, "rss_after_mb": after,
                         "returned_mb": None if before is None or after is None else round(before - after, 1),
                         "took_ms": round((time.perf_counter() - t0) * 1000, 1)}
            log.info("idle: returned %s MB to the OS (RSS %s -> %s MB)", self.last["returned_mb"], before, after)
        finally:
            self._last = time.monotonic()
            self._pending = False

    def state(self) -> dict[str, Any]:
        """For ``/debug/state``: whether trimming is available, how often it ran, what the last one returned."""
        return {"available": self._trim is not None, "releases": self.releases, "last": self.last, "rss_mb": rss_mb()}
