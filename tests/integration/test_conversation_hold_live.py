"""Conversations that hold together (issue #50), with the real packaged SmolLM2: each control on the llama.cpp
thinker (real llama-server), the built-in torch engine (real weights) and the remote engine against omni-rt's own
OpenAI-compatible server front; and the issue's twelve-turn conversation on a real server.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from omni_rt.engine.prompt.history import HistoryWindow, recall_hints
from omni_rt.engine.streamed.remote import request_body
from omni_rt.engine.prompt.repetition import LLAMA_CPP_PENALTY_KEYS, RepeatGuard, copy_retry, earlier_answers, llama_cpp_fields
from omni_rt.engine.prompt.request import GenRequest, SamplingParams, parse_request
from omni_rt.engine.tools.prompt import _for_own, speakable

PRESET_SAMPLING = {"repetition_penalty": 1.2, "no_repeat_ngram_size": 4}


def _words(text: str) -> list[str]:
    from omni_rt.engine.prompt.repetition import words_of

    return words_of(text)


def _max_4gram(text: str) -> int:
    w = _words(text)
    return max(Counter(tuple(w[i:i + 4]) for i in range(len(w) - 3)).values(), default=0)


# ============================================================================ integration: real models
SYSTEM = {"role": "system", "content": "You are a helpful voice assistant. Answer in one or two short spoken sentences."}
LOOP_ASK = "Say the word hello twenty times in a row."


def _tokenizer():
    from omni_rt.engine.weights.loader import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("smollm2"))


def _ask(s, rid: str, messages: list[dict], **kw) -> str:
    from omni_rt.testing.stage_driver import collect, send

    send(s, rid, {"messages": messages, "session_id": kw.pop("session_id", rid), **kw})
    got = collect(s, [rid], timeout=120)[rid]
    assert got["error"] is None, got["error"]
    return got["result"]["text"]


def _check_controls(s, loop_max: int = 3) -> None:
    """Each control on one engine: no 4-gram ``loop_max`` times (the loop ask), no copy of an earlier answer, a
    tool's result in the answer."""
    loop = _ask(s, "loop", [SYSTEM, {"role": "user", "content": LOOP_ASK}], answer_policy={"max_words": 60})
    assert _max_4gram(loop) < loop_max, loop
    first = _ask(s, "c1", [SYSTEM, {"role": "user", "content": "What is the opposite of loud?"}], session_id="copy")
    again = _ask(s, "c2", [SYSTEM, {"role": "user", "content": "What is the opposite of loud?"},
                           {"role": "assistant", "content": first},
                           {"role": "user", "content": "What is the opposite of loud?"}], session_id="copy")
    assert _words(again) != _words(first) and _words(again), (first, again)
    tool = _ask(s, "tool", [SYSTEM, {"role": "user", "content": "What is the weather in Chicago right now?"},
                            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                                "name": "get_weather", "arguments": '{"city": "Chicago"}'}}]},
                            {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"weather": "snowing", "celsius": -3})}],
                tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}],
                tool_choice="none")
    assert any(w in tool.lower() for w in ("snow", "-3", "minus 3", "three")), tool


def test_llama_cpp_thinker_applies_every_control():
    from omni_rt.engine.llama_cpp import build as llama_cpp
    from omni_rt.engine.factory import create_ar_scheduler

    if llama_cpp.locate_binary() is None:
        pytest.skip("llama-server is not built")
    s = create_ar_scheduler("smollm2", backend="llama.cpp", max_batch_size=2, kv_budget_tokens=4096, cpu_threads=1,
                            default_max_tokens=96, sampling=PRESET_SAMPLING, languages=["en"],
                            answer_policy={"max_sentences": 2, "max_words": 35})
    s.start()
    try:
        # the preset's controls reach llama-server (the body it is sent)
        _, body = s.request(parse_request({"messages": [SYSTEM]}, 32, PRESET_SAMPLING))
        assert body["repeat_penalty"] == 1.2 and body["repeat_last_n"] > 0
        _check_controls(s)
        # the copy went on past its end (continuations in the same slot), not held and asked again
        assert s.cache_state()["copy_forks"] >= 1
    finally:
        s.stop()


def test_builtin_torch_engine_applies_every_control():
    from omni_rt.engine.factory import create_ar_scheduler

    s = create_ar_scheduler("smollm2", backend="torch", device="cpu", dtype="float32", max_batch_size=2,
                            default_max_tokens=96, sampling=PRESET_SAMPLING, languages=["en"],
                            answer_policy={"max_sentences": 2, "max_words": 35})
    s.start()
    try:
        # the sampler bans a 4-token n-gram's second time outright; a copy may not end (builtin.copy_ban)
        _check_controls(s, loop_max=2)
    finally:
        s.stop()


def test_remote_engine_against_omni_rts_openai_front_applies_every_control(tmp_path):
    """The remote engine (OpenAI dialect) in front of omni-rt's own OpenAI-compatible server front: the n-gram ban
    and the copy guard are enforced on its stream, the tool result is sent as words."""
    import subprocess
    import sys
    import time

    import httpx

    import socket

    from omni_rt.engine.streamed.remote import RemoteThinker

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "omni_rt.engine.streamed.openai_compat_server", "--port", str(port)],
                            stdout=open(tmp_path / "front.log", "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            pytest.fail((tmp_path / "front.log").read_text()[-2000:])
        s = RemoteThinker(f"http://127.0.0.1:{port}/v1", tokenizer=_tokenizer(), default_max_tokens=96,
                          sampling=PRESET_SAMPLING, languages=["en"], answer_policy={"max_sentences": 2, "max_words": 35},
                          context_tokens=2048)
        s.start()
        try:
            _check_controls(s)
        finally:
            s.stop()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def twelve_turns(live_server):
    from latency_bench.conversations import CONVERSATIONS, run_conversation, score_conversation

    turns = CONVERSATIONS[0]
    answers = asyncio.run(run_conversation(live_server.ws_url, turns, timeout=120, log=False))
    return answers, score_conversation(turns, answers)


def test_the_issues_twelve_turn_conversation_holds_and_recalls_the_name(twelve_turns):
    answers, rows = twelve_turns
    assert not any(r["loop"] or r["repeat"] or r["off_language"] for r in rows), rows
    recall = [r["right"] for r in rows if r["kind"] == "recall"]
    assert len(recall) == 2 and recall[0], answers[-2:]


@pytest.mark.xfail(reason="issue #50: the 135M thinker recalls the city in most runs, not all (greedy on a shared "
                          "llama-server varies with what else its slots held)", strict=False)
def test_the_issues_twelve_turn_conversation_recalls_the_city(twelve_turns):
    answers, rows = twelve_turns
    assert [r["right"] for r in rows if r["kind"] == "recall"][1], answers[-2:]


def test_the_twelve_turns_under_a_clients_be_brief_stay_in_english(live_server):
    """A client's own short instructions ("Be brief.") leave the 135M thinker less steered: the first answer
    opened "Nossa mesaura!", the next "L'capital d'Allemagne, Paris." (asked again, the same), then ten answers
    opened "Ooops, no." (issue #50, item 4). A Portuguese opener is caught at its first word and a retry that
    opens in another language again is forked without that word."""
    from latency_bench.conversations import CONVERSATIONS, run_conversation, score_conversation

    turns = CONVERSATIONS[0]
    answers = asyncio.run(run_conversation(live_server.ws_url, turns, timeout=120, log=False, instructions="Be brief."))
    rows = score_conversation(turns, answers)
    assert not any(r["off_language"] or r["loop"] or r["repeat"] or r["empty"] for r in rows), answers
