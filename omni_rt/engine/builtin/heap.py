"""Give freed heap memory back to the OS when the engine goes idle.

Why this is needed: glibc keeps memory freed below its mmap threshold (which rises to 32 MB as big blocks are
freed) in the process heap, so the KV copies of a session's cached prefix (tens of MB each), prefill
activations and tokenizer buffers stay resident after the sessions that needed them have closed: the soak's
server RSS ended 60-130 MB above where it started although the engine's own KV was back to its idle size.
``malloc_trim(0)`` returns those free pages. Called only when the scheduler is about to sleep on an empty
inbox after freeing something, so its cost (a heap walk, ~1 ms here) never sits in front of a request.
No-op where the C library has no ``malloc_trim`` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

_libc = None
_trim = None
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _trim = getattr(_libc, "malloc_trim", None)
except OSError:
    _trim = None


def give_back_heap() -> float:
    """Return free heap pages to the OS; the seconds it took (0.0 where unsupported)."""
    if _trim is None:
        return 0.0
    t0 = time.perf_counter()
    _trim(0)
    return time.perf_counter() - t0
