"""In-process ``sglang.Engine`` behind the AR-scheduler protocol (GPU machines with the ``sglang`` extra).

sglang is imported only when this scheduler is constructed: nothing else in omni-rt imports it, and no test
needs it. SGLang brings its own continuous batching, radix-tree prefix cache (per-session reuse for free),
CUDA graphs and tensor parallelism; this class only adapts its async streaming API. Abort cancels the
request's task and tells the engine to drop the request.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator

from omni_rt.engine.streamed.async_stream import AsyncStreamScheduler, Delta
from omni_rt.engine.prompt.request import GenRequest
from omni_rt.engine.tools.prompt import render_prompt

log = logging.getLogger(__name__)


class SGLangThinker(AsyncStreamScheduler):
    def __init__(
        self,
        model_path: str,
        *,
        name: str = "sglang",
        default_max_tokens: int = 256,
        dtype: str = "auto",
        **engine_kwargs: Any,
    ) -> None:
        try:
            import sglang
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise ImportError("backend='sglang' needs the sglang extra: pip install 'omni-rt[sglang]'") from exc
        dtype = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}.get(dtype, "auto")
        self.engine = sglang.Engine(model_path=model_path, dtype=dtype, **engine_kwargs)
        tokenizer = getattr(self.engine.tokenizer_manager, "tokenizer", None)
        super().__init__(name=name, default_max_tokens=default_max_tokens, tokenizer=tokenizer)

    def stop(self) -> None:
        super().stop()
        try:
            self.engine.shutdown()
        except Exception as exc:  # pragma: no cover
            log.warning("sglang shutdown: %s", exc)

    async def generate(self, request_id: str, req: GenRequest) -> AsyncIterator[Delta]:  # pragma: no cover - GPU only
        s = req.sampling
        params: dict[str, Any] = {
            "max_new_tokens": req.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1,
            "ignore_eos": req.ignore_eos,
            "skip_special_tokens": True,
            "min_p": s.min_p,  # SGLang's names for the repetition controls (no n-gram ban there)
            "repetition_penalty": s.repetition_penalty,
            "frequency_penalty": s.frequency_penalty,
            "presence_penalty": s.presence_penalty,
        }
        if req.stop:
            params["stop"] = list(req.stop)
        if req.stop_token_ids:
            params["stop_token_ids"] = list(req.stop_token_ids)
        if s.seed is not None:
            params["sampling_seed"] = s.seed
        kwargs: dict[str, Any] = {"sampling_params": params, "stream": True, "rid": request_id}
        if req.messages is not None:
            kwargs["prompt"] = render_prompt(self.tokenizer, req.messages, req.tools, req.tool_choice)
        else:
            kwargs["input_ids"] = req.prompt_ids
        text, n_ids, done = "", 0, False
        try:
            async for out in await self.engine.async_generate(**kwargs):
                # SGLang streams cumulative text/ids unless incremental output is enabled: handle both
                new_text = out.get("text", "")
                delta = new_text[len(text) :] if new_text.startswith(text) else new_text
                text = new_text if new_text.startswith(text) else text + new_text
                ids = out.get("output_ids") or []
                new_ids = ids[n_ids:] if len(ids) >= n_ids else ids
                n_ids = max(n_ids, len(ids))
                meta = out.get("meta_info", {})
                fr = meta.get("finish_reason")
                finish = fr.get("type") if isinstance(fr, dict) else fr
                usage = None
                if finish:
                    done = True
                    usage = {
                        "prompt_tokens": meta.get("prompt_tokens", 0),
                        "completion_tokens": meta.get("completion_tokens", 0),
                        "cached_tokens": meta.get("cached_tokens", 0),
                    }
                yield Delta(delta, list(new_ids), finish, usage)
        finally:
            if not done:
                try:
                    self.engine.tokenizer_manager.abort_request(rid=request_id)
                except Exception as exc:
                    log.debug("sglang abort_request(%s): %s", request_id, exc)
