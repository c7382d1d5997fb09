"""Remote engine: an AR scheduler backed by any OpenAI-compatible streaming endpoint (SGLang, vLLM,
llama.cpp server, or ``omni_rt.engine.streamed.openai_compat_server``).

``messages`` requests go to ``/chat/completions``; ``prompt_ids`` requests to ``/completions`` with a token
list as the prompt (SGLang and vLLM accept it). Connection failures and 5xx/429 answers are retried with
backoff only while nothing has been streamed yet — after the first token a retry would duplicate text.
Abort cancels the request's task, which closes the HTTP stream; SGLang/vLLM abort a request whose client
disconnects, freeing its KV. Prefix reuse is the server's business (SGLang's radix cache); the server's
``usage.prompt_tokens_details.cached_tokens`` is passed through when it reports it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Literal

import httpx

from omni_rt.engine.streamed.async_stream import AsyncStreamScheduler, Delta, UpstreamError
from omni_rt.engine.prompt.history import HistoryWindow
from omni_rt.engine.prompt.request import GenRequest, SamplingParams
from omni_rt.engine.tools.prompt import chat_tools
from omni_rt.engine.tools.schema import callable_tools

_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.RemoteProtocolError, httpx.ReadError)


class _RetryableStatus(Exception):
    pass


Dialect = Literal["openai", "llama.cpp"]


def _penalty_fields(s: SamplingParams, dialect: Dialect) -> dict[str, Any]:
    """Repetition controls in the upstream's own names, only when set (an OpenAI endpoint refuses unknown
    keys; SGLang/vLLM accept their extensions). No OpenAI-compatible upstream has ``no_repeat_ngram_size``: it
    is enforced on the stream instead (``omni_rt.engine.prompt.repetition.RepeatGuard``), never silently dropped.

    llama.cpp gets its own samplers (``repetition.llama_cpp_fields``: ``repeat_penalty`` over a short window, since its penalties count the prompt's tokens too, ours the answer's only, and a long
    window pushes the answer off the question's own words: docs/benchmarks/engine.md, "Penalties through
    llama.cpp"); a forced call gets none of them."""
    if dialect == "llama.cpp":
        from omni_rt.engine.prompt.repetition import llama_cpp_fields

        out = llama_cpp_fields(s)
    else:
        out = {}
        if s.repetition_penalty != 1.0:
            out["repetition_penalty"] = s.repetition_penalty
        if s.frequency_penalty:
            out["frequency_penalty"] = s.frequency_penalty
        if s.presence_penalty:
            out["presence_penalty"] = s.presence_penalty
    if s.min_p > 0:
        out["min_p"] = s.min_p
    return out


def request_body(req: GenRequest, model: str, dialect: Dialect = "openai") -> dict[str, Any]:
    """OpenAI request body; engine-specific knobs (top_k, ignore_eos, ...) only when they differ from defaults.
    ``dialect`` names the upstream's spelling of the extensions (``"llama.cpp"`` for its server)."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if req.messages is not None:
        from omni_rt.engine.tools.prompt import speakable_tool_messages

        # a tool's output as plain words (tool_prompt.speakable): the answer after it is spoken, and small models
        # say a result given as words where they read JSON back braces and all
        body["messages"] = speakable_tool_messages(req.messages)
    else:
        body["prompt"] = req.prompt_ids
    body["max_tokens"] = req.max_tokens
    s = req.sampling
    body["temperature"] = s.temperature
    if s.top_p < 1.0:
        body["top_p"] = s.top_p
    if s.top_k > 0:
        body["top_k"] = s.top_k
    if s.seed is not None:
        body["seed"] = s.seed
    body.update(_penalty_fields(s, dialect))
    if req.stop:
        body["stop"] = list(req.stop)
    if req.stop_token_ids:
        body["stop_token_ids"] = list(req.stop_token_ids)
    if req.ignore_eos:
        body["ignore_eos"] = True
    if req.session_id:
        body["user"] = req.session_id  # omni-rt's server keys prefix reuse on it; others ignore it
    if req.output == "tokens":
        body["return_token_ids"] = True
    # "none": no tools offered at all, as the built-in engine does; under "auto" a tool whose call this turn
    # already has its output is not offered again (tools.schema.callable_tools), so the answer after it is spoken
    still = callable_tools(req.tools, req.tool_choice, req.messages)
    offered = req.tools if still is None else still
    if offered and req.tool_choice != "none":
        body["tools"] = chat_tools(offered)
        choice = req.tool_choice
        if isinstance(choice, dict):
            choice = {"type": "function", "function": {"name": choice["name"]}}
        body["tool_choice"] = choice
        if req.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = req.parallel_tool_calls
    return body


def _usage(u: dict | None) -> dict[str, int] | None:
    if not u:
        return None
    details = u.get("prompt_tokens_details") or {}
    return {
        "prompt_tokens": int(u.get("prompt_tokens") or 0),
        "completion_tokens": int(u.get("completion_tokens") or 0),
        "cached_tokens": int(details.get("cached_tokens") or 0),
    }


# How upstreams say a prompt does not fit: llama.cpp's error type and messages, OpenAI's code, vLLM/SGLang's message.
_OVERFLOW_MARKS = ("exceed_context_size_error", "context_length_exceeded", "exceeds the available context size",
                   "larger than the max context size", "maximum context length")


def error_code(detail: str, default: str) -> str:
    """``context_length_exceeded`` when an upstream's error says the prompt does not fit its context, else
    ``default``: the client is told which, never the upstream's body."""
    return "context_length_exceeded" if any(m in detail for m in _OVERFLOW_MARKS) else default


def parse_sse_chunk(obj: dict) -> Delta:
    """One ``chat.completion.chunk`` or ``text_completion`` chunk -> Delta."""
    if "error" in obj:
        err = obj["error"]
        raise UpstreamError(f"upstream error: {err.get('message', err) if isinstance(err, dict) else err}",
                            code=error_code(json.dumps(err), "upstream_error"))
    timings = obj.get("timings")  # llama-server's, with timings_per_token on every chunk
    d = Delta(usage=_usage(obj.get("usage")), timings=timings if isinstance(timings, dict) else None)
    for ch in obj.get("choices") or []:
        delta = ch.get("delta") or {}
        d.text += delta.get("content") or ch.get("text") or ""
        d.token_ids.extend(ch.get("token_ids") or delta.get("token_ids") or [])
        d.tool_calls.extend(delta.get("tool_calls") or [])
        d.finish_reason = ch.get("finish_reason") or d.finish_reason
    return d


class RemoteThinker(AsyncStreamScheduler):
    def __init__(
        self,
        base_url: str,
        *,
        model: str = "default",
        tokenizer: Any = None,
        api_key: str | None = None,
        name: str = "remote",
        default_max_tokens: int = 256,
        connect_timeout_s: float = 3.0,
        read_timeout_s: float = 60.0,
        retries: int = 2,
        retry_backoff_s: float = 0.25,
        dialect: Dialect = "openai",
        sampling: dict[str, Any] | None = None,
        answer_policy: dict[str, Any] | None = None,
        languages: list[str] | None = None,
        context_tokens: int | None = None,
        history_tokens: int | None = None,
        conversation_tokens: int | None = None,
    ) -> None:
        """``context_tokens``: the upstream's context per request, when known; with a local tokenizer the
        history is then trimmed to it (or to ``history_tokens``; the conversation after the instructions to
        ``conversation_tokens``) before it is sent (``omni_rt.engine.prompt.history``)."""
        super().__init__(
            name=name, default_max_tokens=default_max_tokens, tokenizer=tokenizer, sampling=sampling,
            answer_policy=answer_policy, languages=languages,
        )
        if dialect not in ("openai", "llama.cpp"):
            raise ValueError(f"dialect must be 'openai' or 'llama.cpp', got {dialect!r}")
        self.dialect = dialect
        if dialect == "openai" and "api.openai.com" in base_url and float((sampling or {}).get("repetition_penalty") or 1.0) != 1.0:
            # OpenAI's own API has no multiplicative repetition penalty (vLLM/SGLang do) and answers every request
            # that sends one with HTTP 400: refused here, at start-up, rather than dropped or failed per answer
            raise ValueError(f"stage '{name}' field 'sampling.repetition_penalty': {base_url} has no repetition penalty "
                             "(OpenAI's API offers frequency_penalty and presence_penalty, which count differently); "
                             "remove it or use one of those")
        self.conversation_tokens = conversation_tokens  # the llama.cpp subclass builds its window at start
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=10.0, pool=10.0)
        self._client: httpx.AsyncClient | None = None
        if tokenizer is not None and (context_tokens or history_tokens):
            self.history = HistoryWindow(tokenizer, int(context_tokens or history_tokens), session_tokens=history_tokens,
                                         conversation_tokens=conversation_tokens, name=name)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def request(self, req: GenRequest, request_id: str | None = None) -> tuple[str, dict[str, Any]]:
        """The endpoint path and body for ``req`` (a subclass may speak an upstream's own dialect)."""
        return ("/chat/completions" if req.messages is not None else "/completions"), request_body(req, self.model, self.dialect)

    def http_client(self) -> httpx.AsyncClient:
        """The upstream's HTTP client, created inside the loop thread it will live in."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout, headers=self._headers)
        return self._client

    async def generate(self, request_id: str, req: GenRequest) -> AsyncIterator[Delta]:
        client = self.http_client()
        path, body = self.request(req, request_id)
        url = self.base_url + path
        started = False
        for attempt in range(self.retries + 1):
            try:
                async with client.stream("POST", url, json=body) as resp:
                    if resp.status_code != 200:
                        detail = (await resp.aread()).decode(errors="replace")[:500]
                        if resp.status_code >= 500 or resp.status_code == 429:
                            raise _RetryableStatus(f"HTTP {resp.status_code}: {detail}")
                        raise UpstreamError(
                            f"{url} answered HTTP {resp.status_code}: {detail}", code=error_code(detail, "upstream_http_error")
                        )
                    async for line in resp.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == "[DONE]":
                            return
                        delta = parse_sse_chunk(json.loads(payload))
                        started = started or bool(delta.text or delta.token_ids or delta.tool_calls)
                        yield delta
                    return
            except httpx.ReadTimeout as exc:
                if started or attempt == self.retries:
                    raise UpstreamError(
                        f"{url} stalled: no data for {self._timeout.read:.0f} s", code="upstream_timeout"
                    ) from exc
            except (*_RETRYABLE, _RetryableStatus) as exc:
                if started:
                    raise UpstreamError(f"stream from {url} broke mid-answer ({type(exc).__name__}: {exc})") from exc
                if attempt == self.retries and isinstance(exc, _RetryableStatus):
                    raise UpstreamError(
                        f"{url} answered {exc} ({attempt + 1} attempts)", code="upstream_http_error"
                    ) from exc
                if attempt == self.retries:
                    raise UpstreamError(
                        f"cannot reach {url} after {attempt + 1} attempts ({type(exc).__name__}: {exc}); "
                        "is the OpenAI-compatible server running?",
                        code="upstream_unavailable",
                    ) from exc
            await asyncio.sleep(self.retry_backoff_s * 2**attempt)
