"""Drive a stage from a script: put requests in its inbox, read its outbox until each has its answer.

Used by the engine benchmark (``latency_bench engine``) and by the stage tests (``tests/``), which run real
schedulers this way; it lives here, outside ``omni_rt``, because the server never needs it.
"""

from __future__ import annotations

import queue
import time
from typing import Any, Iterable

from omni_rt.pipeline.messages import IncomingMessage


def send(scheduler: Any, request_id: str, data: dict[str, Any]) -> None:
    scheduler.inbox.put(IncomingMessage(request_id, "new_request", data))


def collect(scheduler: Any, request_ids: Iterable[str], timeout: float = 60.0) -> dict[str, dict[str, Any]]:
    """Read the outbox until every id has a ``result`` or ``error``.

    Returns ``{id: {"stream": [chunk data...], "result": data | None, "error": (message, code) | None}}``.
    """
    out = {rid: {"stream": [], "result": None, "error": None} for rid in request_ids}
    open_ids = set(out)
    deadline = time.monotonic() + timeout
    while open_ids:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no result for {sorted(open_ids)} within {timeout} s")
        try:
            msg = scheduler.outbox.get(timeout=left)
        except queue.Empty:
            continue
        entry = out.setdefault(msg.request_id, {"stream": [], "result": None, "error": None})
        if msg.type == "stream":
            entry["stream"].append(msg.data)
        elif msg.type == "result":
            entry["result"] = msg.data
            open_ids.discard(msg.request_id)
        elif msg.type == "error":
            entry["error"] = (msg.data, msg.metadata.get("code"))
            open_ids.discard(msg.request_id)
    return out


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
