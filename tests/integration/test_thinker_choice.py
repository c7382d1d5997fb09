"""``omni-rt serve --thinker MODEL``: a local GGUF file or an OpenAI-compatible server as the thinker.

Wrong choices fail at start-up with one line (a missing path, a directory, a file that is no GGUF, a GGUF
without a chat template — written here by the ``gguf`` package —, an unreachable server, a URL that is no
OpenAI-compatible API); the good ones serve a real turn: a copy of the packaged GGUF at another path, and a
llama-server (the one scripts/install.sh builds) on 127.0.0.1 as the upstream. No hub download anywhere.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import websockets
from servers import ROOT, free_port, start_server, stop_server
from test_realtime_tools import Client
from tiny_models import metadata_gguf

from omni_rt.engine.llama_cpp import build as llama_cpp
from omni_rt.engine.llama_cpp.server import LlamaServer, LlamaServerArgs
from omni_rt.engine.streamed.openai_compat_server import ServerThread
from omni_rt.engine.weights.thinker_choice import ThinkerError, thinker_args
from omni_rt.engine.weights.smollm2 import packaged_gguf_path


def test_wrong_server_choices_fail_with_one_clear_line():
    with pytest.raises(ThinkerError, match="cannot reach it"):
        thinker_args(f"http://127.0.0.1:{free_port()}/v1", timeout_s=2.0)
    from fastapi import FastAPI

    app = FastAPI()
    app.get("/v1/models")(lambda: {"object": "list", "data": []})
    srv = ServerThread(app).start()
    try:
        root = srv.base_url.removesuffix("/v1")
        with pytest.raises(ThinkerError, match="HTTP 404"):
            thinker_args(f"{root}/nope")
        with pytest.raises(ThinkerError, match="lists no model"):
            thinker_args(f"{root}/v1")
    finally:
        srv.stop()


def test_cli_prints_one_line_and_exits_2(tmp_path):
    missing = tmp_path / "missing.gguf"
    proc = subprocess.run([sys.executable, "-m", "omni_rt.cli", "serve", "--thinker", str(missing)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert proc.stderr.strip().splitlines() == [f"omni-rt: error: --thinker {missing}: no such file"], proc.stderr


async def _capital_turn(server) -> str:
    ws = await websockets.connect(f"{server.ws_url}/v1/realtime", max_size=None, open_timeout=60)
    try:
        rt = Client(ws)  # validates every server event against openai-python's RealtimeServerEvent
        assert (await rt.next())["type"] == "session.created"
        await rt.say("What is the capital of France?")
        await rt.send({"type": "response.create"})
        done = (await rt.until("response.done"))[-1]["response"]
        assert done["status"] == "completed", done
        return " ".join(c.get("transcript") or c.get("text") or "" for o in done["output"] for c in o.get("content", []))
    finally:
        await ws.close()


@pytest.fixture(scope="module")
def binary():
    found = llama_cpp.locate_binary()
    if found is None:
        pytest.skip("llama-server is not built here (scripts/install.sh builds it)")
    return found


async def test_serve_with_a_local_gguf(tmp_path, binary):
    model = tmp_path / "models" / "my-thinker.gguf"
    model.parent.mkdir()
    shutil.copyfile(packaged_gguf_path(), model)  # any GGUF at any path: here the packaged weights, moved
    server = start_server(tmp_path, "--thinker", str(model), "--max-sessions", "2")
    try:
        assert "paris" in (await _capital_turn(server)).lower()
        log = server.log_path.read_text()
        assert f"thinker (stage thinker): {model}" in log and "falling back" not in log
    finally:
        stop_server(server)


async def test_serve_with_an_openai_compatible_server(tmp_path, binary):
    upstream = LlamaServer(binary, LlamaServerArgs(packaged_gguf_path(), threads=1, parallel=2, ctx_size=2048,
                                                   cache_ram_mib=0), log_path=tmp_path / "upstream.log")
    upstream.start()
    try:
        server = start_server(tmp_path, "--thinker", f"{upstream.base_url}/v1", "--max-sessions", "2")
        try:
            assert "paris" in (await _capital_turn(server)).lower()
        finally:
            stop_server(server)
    finally:
        upstream.stop()


def _hub_env(tmp_path: Path) -> dict[str, str]:
    import os

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    env.pop("OMNI_RT_ALLOW_THINKER_DOWNLOAD", None)
    return env


def test_hub_repo_thinker_comes_from_the_cache_or_fails_in_one_line(tmp_path):
    """``--thinker OWNER/REPO[:FILE]``: a GGUF already in the Hugging Face cache is used with no network (the
    cache laid out as huggingface_hub writes it); one not cached, with the operator's HF_HUB_OFFLINE=1, stops the
    start with one line (no download is attempted: nothing here reaches a hub)."""
    snap = tmp_path / "hf" / "hub" / "models--someone--tiny-chat-GGUF" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0" * 40)
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    for name in ("tiny-chat-Q4_K_M.gguf", "tiny-chat-Q8_0.gguf"):
        metadata_gguf(snap / name, template)
    probe = ("import sys; from omni_rt.engine.weights.thinker_choice import thinker_args, ThinkerError\n"
             "try: print(thinker_args(sys.argv[1])['model'])\n"
             "except ThinkerError as e: print('ERR', e)\n")
    run = lambda spec: subprocess.run([sys.executable, "-c", probe, spec], env=_hub_env(tmp_path), cwd=ROOT,
                                      capture_output=True, text=True, timeout=120).stdout.strip()
    assert run("someone/tiny-chat-GGUF").endswith("tiny-chat-Q4_K_M.gguf")  # several files: the Q4_K_M one
    assert run("someone/tiny-chat-GGUF:tiny-chat-Q8_0.gguf").endswith("tiny-chat-Q8_0.gguf")
    cli = subprocess.run([sys.executable, "-m", "omni_rt.cli", "serve", "--thinker", "someone/not-cached-GGUF"],
                         env=_hub_env(tmp_path), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2, cli.stderr[-2000:]
    line = cli.stderr.strip().splitlines()[-1]
    assert "not in the Hugging Face cache" in line and "HF_HUB_OFFLINE" in line, cli.stderr[-2000:]
