"""Responses delegation's backend: one streamed chat-completions request to the operator's OpenAI-compatible
server (``--delegate URL``) per delegated response, its output handed back to the ``LiveSession`` piece by piece.

The session (``omni_rt.session.live``) owns the Responses semantics (``response.event`` envelopes, function
calls and their outputs, continuations); this module only moves the request and the stream: text deltas, each
finished tool call, the end or a failure. Bounded: a connect and a read timeout, at most ``MAX_STREAM_CHARS`` of
output per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

import httpx

log = logging.getLogger("omni_rt.live")

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0  # no byte from the backend for this long fails the request
MAX_STREAM_CHARS = 64 * 1024  # text and tool arguments of one response
MAX_TOOL_CALLS = 16


async def run_backend(url: str, api_key: str | None, body: dict[str, Any],
                      emit: Callable[[str, Any], None]) -> None:
    """POST ``body`` (chat completions, ``stream: true``) to ``url``/chat/completions; ``emit(kind, data)`` with
    kind ``text`` (a delta), ``tool_call`` ({id, name, arguments}), ``done`` (finish reason) or ``error`` (a
    client-facing message)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    calls: dict[int, dict[str, str]] = {}
    total = 0
    finish = "stop"
    try:
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        async with httpx.AsyncClient(timeout=timeout) as http:
            async with http.stream("POST", url.rstrip("/") + "/chat/completions", json={**body, "stream": True},
                                   headers=headers) as resp:
                if resp.status_code != 200:
                    emit("error", f"the delegation backend answered HTTP {resp.status_code}")
                    return
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                        choice = chunk["choices"][0]
                    except (ValueError, KeyError, IndexError, TypeError):
                        continue
                    delta = choice.get("delta") or {}
                    text = delta.get("content")
                    if isinstance(text, str) and text:
                        total += len(text)
                        emit("text", text)
                    for tc in delta.get("tool_calls") or []:
                        idx = tc.get("index", 0)
                        if idx not in calls and len(calls) >= MAX_TOOL_CALLS:
                            continue
                        c = calls.setdefault(idx, {"id": "", "name": "", "arguments": ""})
                        c["id"] = tc.get("id") or c["id"]
                        fn = tc.get("function") or {}
                        c["name"] = fn.get("name") or c["name"]
                        args = fn.get("arguments") or ""
                        total += len(args)
                        c["arguments"] += args
                    if total > MAX_STREAM_CHARS:
                        finish = "length"
                        break
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
    except httpx.HTTPError as exc:
        log.warning("delegation backend %s failed: %r", url, exc)
        emit("error", "the delegation backend could not be reached or stopped answering")
        return
    for c in calls.values():
        emit("tool_call", c)
    emit("done", finish)


class BackendTasks:
    """The Responses backend requests of one Live session, each a task; all cancelled when the session ends."""

    def __init__(self, url: str | None, api_key: str | None, deliver: Callable[[str, str, Any], None]) -> None:
        """``deliver(response_id, kind, data)``: hand one piece of a response's stream to the session."""
        self.url, self.api_key, self.deliver = url, api_key, deliver
        self._tasks: set[asyncio.Task] = set()

    def start(self, jobs: list[Any]) -> None:
        for job in jobs:
            if self.url is None:
                self.deliver(job.response_id, "error", "no delegation backend is configured")
                continue
            task = asyncio.create_task(run_backend(self.url, self.api_key, job.body,
                                                   lambda kind, data, rid=job.response_id: self.deliver(rid, kind, data)),
                                       name=f"delegate-{job.response_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
