"""A minimal OpenAI-compatible server (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``) in front of
any AR scheduler — e.g. the built-in engine, so one omni-rt box can serve as the remote thinker of others.

Streaming is SSE. A client that goes away aborts its request in the scheduler (KV slot freed at the next step).
Function calling as in chat completions: ``tools``, ``tool_choice`` (``required`` / named decode under a
JSON-schema grammar), ``parallel_tool_calls``; tool calls stream as ``delta.tool_calls`` and end with
``finish_reason: "tool_calls"``. Extensions to the OpenAI schema: ``top_k``, ``ignore_eos``,
``stop_token_ids``; ``user`` (or ``session_id``) keys per-session prefix reuse; each choice carries ``token_ids``; temperature defaults to greedy.
"""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import threading
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from omni_rt.pipeline.messages import IncomingMessage, OutgoingMessage
from omni_rt.contracts.payloads import ToolCallDelta, ToolCallDone, text_of


class _Bridge:
    """Routes the scheduler's outbox (a thread-safe queue) to one asyncio queue per request."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.queues: dict[str, asyncio.Queue[OutgoingMessage]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._pump, name="openai-compat-bridge", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _pump(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.scheduler.outbox.get(timeout=0.1)
            except queue.Empty:
                continue
            self._loop.call_soon_threadsafe(self._deliver, msg)

    def _deliver(self, msg: OutgoingMessage) -> None:
        q = self.queues.get(msg.request_id)
        if q is not None:  # outputs of a request nobody waits for any more are dropped
            q.put_nowait(msg)


def _content(content: Any) -> str:
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _message(m: Any) -> Any:
    if not isinstance(m, dict):
        return m  # parse_request names the bad message
    out = {"role": m.get("role"), "content": _content(m.get("content"))}
    for key in ("tool_calls", "tool_call_id"):
        if m.get(key) is not None:
            out[key] = m[key]
    return out


def _flat_tools(tools: Any) -> Any:
    """Chat-completions tools (``{"type": "function", "function": {...}}``) -> the engine's flat shape."""
    if not isinstance(tools, list):
        return tools  # validate_tools names the problem
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict):
            raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name', 'parameters'}}}}")
        flat = {"type": t.get("type"), "name": fn.get("name")}
        for key in ("description", "parameters", "strict"):
            if key in fn:
                flat[key] = fn[key]
        out.append(flat)
    return out


def to_new_request(body: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """OpenAI request body -> the AR scheduler's ``new_request`` data."""
    data: dict[str, Any] = {}
    if "messages" in body:
        data["messages"] = [_message(m) for m in body["messages"]]
        if body.get("tools"):
            data["tools"] = _flat_tools(body["tools"])
        for key in ("tool_choice", "parallel_tool_calls"):
            if body.get(key) is not None:
                data[key] = body[key]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; send token ids")
            prompt = list(tokenizer(prompt)["input_ids"])
        data["prompt_ids"] = prompt
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None:
        data["max_tokens"] = max_tokens
    for key in ("temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos"):
        if body.get(key) is not None:
            data[key] = body[key]
    session = body.get("session_id") or body.get("user")
    if session:
        data["session_id"] = str(session)
    return data


def create_app(scheduler: Any, *, model_name: str = "omni-rt") -> FastAPI:
    bridge = _Bridge(scheduler)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()  # idempotent; the owner stops it
        bridge.start(asyncio.get_running_loop())
        yield
        bridge.stop()

    app = FastAPI(title="omni-rt OpenAI-compatible engine", lifespan=lifespan)
    app.state.aborted = []  # ids aborted because their client went away (metrics, tests)

    async def run(rid: str, data: dict[str, Any]) -> AsyncIterator[OutgoingMessage]:
        q: asyncio.Queue[OutgoingMessage] = asyncio.Queue()
        bridge.queues[rid] = q
        scheduler.inbox.put(IncomingMessage(rid, "new_request", data))
        done = False
        try:
            while True:
                msg = await q.get()
                done = msg.type in ("result", "error")
                yield msg
                if done:
                    return
        finally:
            bridge.queues.pop(rid, None)
            if not done:
                scheduler.abort(rid)
                app.state.aborted.append(rid)

    def error_response(msg: OutgoingMessage) -> JSONResponse:
        code = msg.metadata.get("code", "server_error")
        status = 400 if code == "bad_request" else 500
        return JSONResponse(
            {
                "error": {
                    "message": msg.data,
                    "type": "invalid_request_error" if status == 400 else "server_error",
                    "code": code,
                }
            },
            status,
        )

    def usage(res: dict[str, Any]) -> dict[str, Any]:
        return {
            "prompt_tokens": res["prompt_tokens"],
            "completion_tokens": res["completion_tokens"],
            "total_tokens": res["prompt_tokens"] + res["completion_tokens"],
            "prompt_tokens_details": {"cached_tokens": res["cached_tokens"]},
        }

    async def handle(request: Request, chat: bool) -> Any:
        body = await request.json()
        try:
            data = to_new_request(body, getattr(scheduler, "tokenizer", None))
        except Exception as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, 400)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        stream = run(rid, data)
        first = await stream.__anext__()
        if first.type == "error":
            await stream.aclose()
            return error_response(first)

        def choice(text: str, ids: list[int], finish: str | None, delta: bool) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "finish_reason": finish, "token_ids": ids}
            if not chat:
                c["text"] = text
            elif delta:
                c["delta"] = {"content": text} if text else {}
            else:
                c["message"] = {"role": "assistant", "content": text}
            return c

        def with_calls(c: dict[str, Any], res: dict[str, Any]) -> dict[str, Any]:
            if chat and res.get("tool_calls"):
                c["message"]["content"] = c["message"]["content"] or None
                c["message"]["tool_calls"] = [
                    {
                        "id": t["call_id"],
                        "type": "function",
                        "function": {"name": t["name"], "arguments": t["arguments"]},
                    }
                    for t in res["tool_calls"]
                ]
            return c

        started_calls: set[int] = set()

        def call_delta(tc: ToolCallDelta, ids: list[int]) -> dict[str, Any]:
            """A ``tool_calls`` delta: id, type and name on a call's first chunk only, as OpenAI streams them."""
            entry: dict[str, Any] = {"index": tc.index, "function": {"arguments": tc.arguments_delta}}
            if tc.index not in started_calls:
                started_calls.add(tc.index)
                entry.update(id=tc.call_id, type="function")
                entry["function"]["name"] = tc.name
            return {"index": 0, "finish_reason": None, "token_ids": ids, "delta": {"tool_calls": [entry]}}

        if not body.get("stream"):
            msg = first
            async for msg in stream:
                pass
            if msg.type == "error":
                return error_response(msg)
            res = msg.data
            return {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model_name,
                "choices": [with_calls(choice(res["text"], res["token_ids"], res["finish_reason"], False), res)],
                "usage": usage(res),
            }

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunk_obj = obj + ".chunk" if chat else obj

        def sse(payload: dict[str, Any]) -> str:
            return f"data: {json.dumps(payload)}\n\n"

        def chunk(choices: list, **extra: Any) -> str:
            return sse(
                {"id": rid, "object": chunk_obj, "created": created, "model": model_name, "choices": choices, **extra}
            )

        async def events() -> AsyncIterator[str]:
            try:
                if chat:
                    yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
                msg = first
                while True:
                    if msg.type == "stream" and isinstance(msg.data, ToolCallDone):
                        pass  # the OpenAI stream has no per-call end; finish_reason "tool_calls" closes them
                    elif msg.type == "stream" and isinstance(msg.data, ToolCallDelta):
                        if chat:
                            yield chunk([call_delta(msg.data, msg.data.token_ids)])
                    elif msg.type == "stream":
                        yield chunk([choice(text_of(msg.data), msg.data.token_ids, None, True)])
                    elif msg.type == "result":
                        yield chunk([choice("", [], msg.data["finish_reason"], True)])
                        if include_usage:
                            yield chunk([], usage=usage(msg.data))
                        break
                    elif msg.type == "error":
                        yield sse(
                            {"error": {"message": msg.data, "type": "server_error", "code": msg.metadata.get("code")}}
                        )
                        break
                    msg = await stream.__anext__()
                yield "data: [DONE]\n\n"
            finally:
                await stream.aclose()  # runs when the client disconnects, too: aborts the request

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "omni-rt"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "live": scheduler.live_state()}

    return app


class ServerThread:
    """Run a uvicorn server for ``app`` in a daemon thread (tests, benchmarks, embedding)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 10.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()


def main() -> None:
    """``python -m omni_rt.engine.streamed.openai_compat_server --model smollm2 --port 8001``"""
    import argparse

    import uvicorn

    from omni_rt.engine.factory import create_ar_scheduler

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    args = ap.parse_args()
    sched = create_ar_scheduler(args.model, device=args.device, dtype=args.dtype, max_batch_size=args.max_batch_size)
    try:
        uvicorn.run(create_app(sched, model_name=args.model), host=args.host, port=args.port)
    finally:
        sched.stop()


if __name__ == "__main__":
    main()
