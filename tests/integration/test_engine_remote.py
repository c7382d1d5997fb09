"""Remote engine against a real OpenAI-compatible server on 127.0.0.1 (omni-rt's own, serving the built-in
engine with a tiny random Llama and the SmolLM2 tokenizer): streaming, abort closing the upstream stream,
and a clear error when the endpoint is down."""

from __future__ import annotations

import socket

import httpx
import pytest

from omni_rt.engine.weights import loader as weights
from omni_rt.engine.factory import create_ar_scheduler
from omni_rt.engine.streamed.openai_compat_server import ServerThread, create_app
from tiny_models import build_tiny_model
from omni_rt.testing.stage_driver import collect, send, wait_until

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = weights.load_tokenizer(weights.ensure_smollm2())
    return build_tiny_model("llama", tmp_path_factory.mktemp("remote") / "llama", vocab_size=len(tok), tokenizer=tok)


@pytest.fixture(scope="module")
def server(model_dir):
    backend = create_ar_scheduler(str(model_dir), max_batch_size=4)
    app = create_app(backend, model_name="tiny")
    srv = ServerThread(app).start()
    srv.backend, srv.app = backend, app
    yield srv
    srv.stop()
    backend.stop()


@pytest.fixture(scope="module")
def local(model_dir):
    """The same engine in-process: the reference the remote path must reproduce."""
    sched = create_ar_scheduler(str(model_dir), max_batch_size=4)
    sched.start()
    yield sched
    sched.stop()


@pytest.fixture()
def remote(server, model_dir):
    sched = create_ar_scheduler("tiny", backend="remote", base_url=server.base_url, tokenizer=str(model_dir))
    sched.start()
    yield sched
    sched.stop()


def test_remote_streams_chat_like_local(remote, local):
    req = {"messages": MSGS, "max_tokens": 12, "ignore_eos": True}
    send(remote, "r", req)
    send(local, "r", req)
    got, want = collect(remote, ["r"])["r"], collect(local, ["r"])["r"]
    assert got["error"] is None, got["error"]
    res = got["result"]
    assert len(got["stream"]) >= 12  # streamed token by token, not in one piece
    assert "".join(c.text for c in got["stream"]) == res["text"] == want["result"]["text"]
    assert res["token_ids"] == want["result"]["token_ids"]
    assert res["finish_reason"] == "length"
    assert res["prompt_tokens"] == want["result"]["prompt_tokens"] and res["completion_tokens"] == 12
    assert remote.tokenizer is not None
    assert wait_until(lambda: remote.live_state() == 0)


def test_remote_prompt_ids_via_completions(remote, local):
    req = {"prompt_ids": [100, 200, 300, 400], "max_tokens": 8, "ignore_eos": True, "output": "tokens"}
    send(remote, "p", req)
    send(local, "p", req)
    got, want = collect(remote, ["p"])["p"]["result"], collect(local, ["p"])["p"]["result"]
    assert got["token_ids"] == want["token_ids"] and len(got["token_ids"]) == 8


def test_remote_abort_closes_upstream_stream(remote, server):
    before = len(server.app.state.aborted)
    send(remote, "long", {"messages": MSGS, "max_tokens": 400, "ignore_eos": True})
    chunks = 0
    while chunks < 3:
        msg = remote.outbox.get(timeout=30)
        assert msg.type == "stream", msg
        chunks += 1
    remote.abort("long")
    res = collect(remote, ["long"])["long"]
    assert res["result"]["finish_reason"] == "abort"
    # the server saw the client go away and aborted the request in its engine
    assert wait_until(lambda: len(server.app.state.aborted) == before + 1, timeout=10)
    assert wait_until(lambda: server.backend.live_state() == 0, timeout=10)
    assert wait_until(lambda: remote.live_state() == 0)


def test_remote_endpoint_down_gives_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    sched = create_ar_scheduler(
        "x", backend="remote", base_url=f"http://127.0.0.1:{port}/v1", retries=1, retry_backoff_s=0.01
    )
    sched.start()
    try:
        send(sched, "d", {"messages": MSGS})
        err = collect(sched, ["d"], timeout=20)["d"]["error"]
        assert err is not None
        message, code = err
        assert code == "upstream_unavailable"
        assert f"127.0.0.1:{port}/v1/chat/completions" in message and "2 attempts" in message
        assert "server running" in message
        assert wait_until(lambda: sched.live_state() == 0)
    finally:
        sched.stop()


def test_server_non_streaming_and_bad_request(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        r = client.post(
            "/chat/completions", json={"model": "tiny", "messages": MSGS, "max_tokens": 5, "ignore_eos": True}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 5
        assert body["choices"][0]["finish_reason"] == "length"
        r = client.post("/completions", json={"model": "tiny", "prompt": [1, 10**9], "max_tokens": 5})
        assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
        assert client.get("/models").json()["data"][0]["id"] == "tiny"


def test_remote_relays_http_errors(remote):
    send(remote, "bad", {"prompt_ids": [1, 10**9], "max_tokens": 5})
    message, code = collect(remote, ["bad"])["bad"]["error"]
    assert code == "upstream_http_error" and "HTTP 400" in message and "vocabulary" in message
