"""The voice answer policy on the remote path (omni-rt's own OpenAI-compatible server on 127.0.0.1, which
must be cancelled upstream when the policy stops) and end to end through the live server. The policy itself and
the built-in AR scheduler: tests/unit/engine/test_answer_policy.py.
"""

from __future__ import annotations

import asyncio
import collections
import json

import pytest
import websockets

from omni_rt.engine.weights import loader as weights
from omni_rt.engine.prompt.answer_policy import AnswerPolicy, count_words
from omni_rt.engine.factory import create_ar_scheduler
from omni_rt.engine.streamed.openai_compat_server import ServerThread, create_app
from omni_rt.engine.prompt.request import AnswerPolicyParams as P
from omni_rt.engine.prompt.request import parse_request
from tiny_models import build_tiny_model
from omni_rt.testing.stage_driver import collect, send, wait_until


# ---------------------------------------------------------------- in the schedulers
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = weights.load_tokenizer(weights.ensure_smollm2())
    return build_tiny_model("llama", tmp_path_factory.mktemp("policy") / "llama", vocab_size=len(tok), tokenizer=tok)


MSGS = [{"role": "user", "content": "Say something."}]


def check_policy_result(got: dict, max_words: int) -> str:
    assert got["error"] is None, got["error"]
    res = got["result"]
    text = "".join(c.text for c in got["stream"])
    assert text == res["text"], "the result text must be exactly what was streamed (what the talker speaks)"
    assert res["finish_reason"] == "policy", res
    assert 1 <= count_words(text) <= max_words and text[-1] in ".!?", text
    return text


def test_remote_path_applies_the_policy_and_cancels_upstream(model_dir):
    backend = create_ar_scheduler(str(model_dir), max_batch_size=2)
    app = create_app(backend, model_name="tiny")
    srv = ServerThread(app).start()
    remote = create_ar_scheduler("tiny", backend="remote", base_url=srv.base_url, tokenizer=str(model_dir),
                                 answer_policy={"max_words": 5})
    remote.start()
    try:
        before = len(app.state.aborted)
        send(remote, "r", {"messages": MSGS, "max_tokens": 400, "ignore_eos": True})
        check_policy_result(collect(remote, ["r"], timeout=120)["r"], 5)
        assert wait_until(lambda: len(app.state.aborted) == before + 1, timeout=10), "upstream not cancelled"
        assert wait_until(lambda: backend.live_state() == 0 and remote.live_state() == 0, timeout=10)
    finally:
        remote.stop()
        srv.stop()
        backend.stop()


# ---------------------------------------------------------------- end to end
async def _ask_text(ws_url: str, question: str) -> tuple[str, dict]:
    async with websockets.connect(f"{ws_url}/v1/realtime", max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                                                        "output_modalities": ["text"]}}))
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}}))
        await ws.send(json.dumps({"type": "response.create"}))
        deltas: list[str] = []
        while True:
            ev = json.loads(await ws.recv())
            assert ev["type"] != "error", ev
            if ev["type"] == "response.output_text.delta":
                deltas.append(ev["delta"])
            if ev["type"] == "response.done":
                return "".join(deltas), ev["response"]


@pytest.mark.parametrize("question", ["Name three colors of the rainbow.", "Tell me a fun fact about cats."])
def test_live_server_answers_a_former_looping_question_briefly(live_server, question):
    """These looped for 20+ s of audio under plain greedy decoding; the preset's defaults keep them short."""
    text, done = asyncio.run(asyncio.wait_for(_ask_text(live_server.ws_url, question), 180))
    assert done["status"] == "completed", done
    words = text.lower().split()
    assert 1 <= len(words) <= 40, text
    grams = collections.Counter(tuple(words[i : i + 4]) for i in range(len(words) - 3))
    assert max(grams.values(), default=0) < 3, f"a 4-gram repeats: {text!r}"
    assert text.rstrip()[-1] in ".!?", f"not cut at a sentence boundary: {text!r}"
    assert text.isascii(), text
