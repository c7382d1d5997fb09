"""``create_ar_scheduler``: the one entry point the declarative pipeline config names for a thinker/talker.

Backends are imported lazily so that importing this module never pulls in httpx clients or sglang.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any, Literal

from omni_rt.pipeline.schedulers.base import ThreadedScheduler

log = logging.getLogger(__name__)
# llama.cpp-only stage args: a preset names them beside the args every backend shares, so the same stage can
# fall back to (or be switched to) another backend; only the llama.cpp branch ever receives them
_LLAMA_KEYS = ("cache_ram_mib", "read_timeout_s", "batch_tokens", "unified_kv", "prefill_piece_tokens",
               "cache_reuse_tokens", "extra_args", "llama_cpp_root", "pace_ahead_s", "gguf_format")


def _try_tokenizer(source: str | None):
    if source is None:
        return None
    from omni_rt.engine.weights.loader import load_tokenizer, resolve_model

    try:
        path = resolve_model(source)
        if not Path(path).exists():  # a server-side model name: never fetch from a hub at run time
            return None
        return load_tokenizer(path)
    except Exception as exc:
        log.info("no local tokenizer for %r (%s); token counting unavailable", source, exc)
        return None


def create_ar_scheduler(
    model: str,
    device: str = "cpu",
    dtype: str = "float32",
    max_batch_size: int = 8,
    async_decode: bool = True,
    prefix_reuse: bool = True,
    kv_budget_tokens: int = 32768,
    default_max_tokens: int = 256,
    backend: Literal["torch", "remote", "sglang", "llama.cpp"] = "torch",
    base_url: str | None = None,
    *,
    name: str = "thinker",
    max_seq_len: int | None = None,
    cpu_threads: int | None = None,
    batch_wait_ms: float = 0.0,
    batch_wait_when_idle: bool = False,
    cuda_graphs: bool = True,
    tokenizer: str | None = None,
    api_key: str | None = None,
    sampling: dict[str, Any] | None = None,
    answer_policy: dict[str, Any] | None = None,
    languages: list[str] | None = None,
    prefill_chunk_tokens: int | None = None,
    history_tokens: int | None = None,
    conversation_tokens: int | None = None,
    short_priority_tokens: int = 1,
    random_init: bool = False,
    random_size: str = "full",
    **backend_kwargs: Any,
) -> ThreadedScheduler:
    """Build an AR scheduler (not started). ``model`` is ``"smollm2"`` (the packaged CPU thinker), a local
    model directory, or — for ``remote`` — the model name the server expects. ``tokenizer`` (a local path)
    overrides where ``scheduler.tokenizer`` comes from. ``sampling`` / ``answer_policy`` / ``languages``:
    the preset's decoding defaults, voice answer policy and the talker's languages (see ``ARScheduler``).
    ``history_tokens``: the prompt tokens one session may keep (default: its share of ``kv_budget_tokens``
    over ``max_batch_size`` slots, at most the context; ``omni_rt.engine.prompt.history``); ``conversation_tokens``: the
    most conversation a prompt keeps after the instructions (every backend with a local tokenizer). ``short_priority_tokens``
    (torch and llama.cpp): a short request holds long prefills back until it has this many tokens.

    ``llama.cpp`` runs ``model`` ("smollm2" = the packaged weights in ``gguf_format``, ``omni_rt.engine.weights.smollm2``; or a ``.gguf`` path) on a managed
    ``llama-server`` (``omni_rt.engine.llama_cpp``): ``cpu_threads`` threads, ``max_batch_size`` slots,
    ``kv_budget_tokens`` of shared context; ``gguf_format`` (``q8_0`` or ``f16``) is the format "smollm2" is
    served in, the fastest one depends on the CPU. Without a built binary it falls back to ``torch`` with a warning.

    ``random_init`` (torch only): random weights of ``model``'s real shape (a model id known to
    ``omni_rt.engine.weights.random_init``; ``random_size="tiny"`` shrinks it for CPU) with SmolLM2's tokenizer as the
    offline stand-in, so the preset runs and is benchmarked with no hub weights.
    """
    if random_init and backend != "torch":
        raise ValueError(f"stage '{name}' field 'random_init': only the torch backend builds random weights, not {backend!r}")
    quality = dict(sampling=sampling, answer_policy=answer_policy, languages=languages)
    llama_args = {k: backend_kwargs.pop(k) for k in _LLAMA_KEYS if k in backend_kwargs}
    if backend in ("llama.cpp", "llama_cpp", "llamacpp"):
        from omni_rt.engine.llama_cpp import build as llama_cpp
        from omni_rt.engine.weights import smollm2

        root = llama_args.pop("llama_cpp_root", None)  # the binary cache (tests point it at an empty dir)
        extra_args = tuple(llama_args.pop("extra_args", ()))
        gguf_format = smollm2.check_format(str(llama_args.pop("gguf_format", smollm2.DEFAULT_FORMAT)), name)
        binary = llama_cpp.locate_binary(root)
        if binary is not None:
            from omni_rt.engine.llama_cpp.server import LlamaServerArgs
            from omni_rt.engine.llama_cpp.thinker import create_llama_cpp_thinker

            gguf = smollm2.ensure_served_gguf(gguf_format) if model == "smollm2" else Path(model)
            server_keys = {f.name for f in dataclasses.fields(LlamaServerArgs)}
            server_args = LlamaServerArgs(
                gguf,
                threads=cpu_threads or 1,
                parallel=max_batch_size,
                ctx_size=kv_budget_tokens,
                extra_args=(*extra_args, *(() if prefix_reuse else ("--no-cache-prompt",))),
                **{k: llama_args.pop(k) for k in list(llama_args) if k in server_keys},
            )
            return create_llama_cpp_thinker(
                server_args,
                binary,
                name=name,
                # a .gguf carries its tokenizer (load_tokenizer reads it), for a preset's `model: FILE.gguf` too:
                # without one a thinker has no token counts, so no history window, language bias or prefill hints
                tokenizer_loader=functools.partial(_try_tokenizer, tokenizer or str(model)),
                default_max_tokens=default_max_tokens,
                history_tokens=history_tokens,
                conversation_tokens=conversation_tokens,
                short_priority_tokens=short_priority_tokens,
                **quality,
                **llama_args,
            )
        log.warning(
            "llama.cpp thinker unavailable (%s; expected %s): falling back to the PyTorch thinker. "
            "Build it with: python -m omni_rt.engine.llama_cpp build",
            llama_cpp.build_failed(root) or "llama-server not built",
            llama_cpp.build_dir(root) / llama_cpp.BINARY_NAME,
        )
        backend = "torch"
    elif llama_args:
        log.info("stage '%s': llama.cpp-only args %s unused by backend %r", name, sorted(llama_args), backend)
    if backend in ("remote", "sglang") and short_priority_tokens != 1:  # their server schedules its own batches
        log.info("stage '%s': short_priority_tokens unused by backend %r", name, backend)
    if backend == "torch":
        if cpu_threads is not None and device == "cpu":
            import torch

            # process-wide: on a small CPU the thinker shares cores with ASR and TTS threads, and torch's
            # OpenMP pool spinning on a busy core costs more than the parallelism gains
            torch.set_num_threads(cpu_threads)
        from omni_rt.engine.builtin.ar_scheduler import ARScheduler
        from omni_rt.engine.builtin.torch_engine import TorchEngine
        from omni_rt.engine.weights.loader import load_model, load_tokenizer, resolve_model, torch_dtype

        if random_init:
            from omni_rt.engine.weights.random_init import build_causal_lm, stand_in_tokenizer

            tok = load_tokenizer(tokenizer) if tokenizer else stand_in_tokenizer()
            module = build_causal_lm(model, dtype=torch_dtype(dtype), device=device, size=random_size, tokenizer=tok)
        else:
            path = resolve_model(model)
            module = load_model(path, dtype, device)
            tok_path = tokenizer or path
            tok = load_tokenizer(tok_path) if tokenizer or (Path(path) / "tokenizer_config.json").exists() else None
        engine = TorchEngine(
            module,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            cuda_graphs=cuda_graphs,
            **backend_kwargs,  # e.g. static_kv
        )
        return ARScheduler(
            engine,
            tok,
            name=name,
            async_decode=async_decode,
            prefix_reuse=prefix_reuse,
            kv_budget_tokens=kv_budget_tokens,
            default_max_tokens=default_max_tokens,
            batch_wait_ms=batch_wait_ms,
            batch_wait_when_idle=batch_wait_when_idle,
            **quality,
            prefill_chunk_tokens=prefill_chunk_tokens,
            history_tokens=history_tokens,
            conversation_tokens=conversation_tokens,
            short_priority_tokens=short_priority_tokens,
        )
    if backend == "remote":
        from omni_rt.engine.streamed.remote import RemoteThinker

        if not base_url:
            raise ValueError("backend='remote' needs base_url, e.g. http://127.0.0.1:30000/v1")
        return RemoteThinker(
            base_url,
            model=model,
            tokenizer=_try_tokenizer(tokenizer or model),
            api_key=api_key,
            name=name,
            default_max_tokens=default_max_tokens,
            history_tokens=history_tokens,
            conversation_tokens=conversation_tokens,
            **quality,
            **backend_kwargs,
        )
    if backend == "sglang":
        from omni_rt.engine.streamed.sglang_engine import SGLangThinker

        return SGLangThinker(model, name=name, default_max_tokens=default_max_tokens, dtype=dtype, **backend_kwargs)
    raise ValueError(f"unknown backend {backend!r}; use 'torch', 'remote', 'sglang' or 'llama.cpp'")
