"""The OpenAI Realtime protocol of `WS /v1/realtime` end to end, against a real `omni-rt serve` (CPU preset).

Every server event received here is validated against openai-python's ``RealtimeServerEvent`` (GA) models
(beta-named events against the beta models). Bad input must get an ``error`` event with a specific ``code``
and leave the session serving, which each case proves with a later ``session.update`` -> ``session.updated``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from openai import AsyncOpenAI
from pydantic import TypeAdapter
from rt_helpers import (
    heard,
    pcm_chunks_b64,
    speech_with_silence,
    ulaw_frames_b64,
    validate_event,
)

from omni_rt.audio.g711 import alaw_decode, alaw_encode, ulaw_decode
from omni_rt.audio.pcm import resample

TEXT_QUESTION = "What is the capital of France?"
_BETA_EVENT: TypeAdapter | None = None


def validate_beta_event(event: dict[str, Any]) -> None:
    global _BETA_EVENT
    if _BETA_EVENT is None:
        from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent

        _BETA_EVENT = TypeAdapter(BetaServerEvent)
    _BETA_EVENT.validate_python(event)


def validate_ga_or_beta(event: dict[str, Any]) -> None:
    """Beta sessions rename some events (beta models); the rest keep their GA shapes."""
    try:
        validate_event(event)
    except Exception:  # noqa: BLE001
        validate_beta_event(event)


class RT:
    """A raw-websocket Realtime client that validates every event it receives and keeps them all."""

    def __init__(self, ws: Any, validate=validate_event) -> None:
        self.ws = ws
        self.validate = validate
        self.events: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(event if isinstance(event, (str, bytes)) else json.dumps(event))

    async def recv(self) -> dict[str, Any]:
        event = json.loads(await self.ws.recv())
        self.validate(event)
        self.events.append(event)
        return event

    async def until(self, etype: str, pred=None) -> dict[str, Any]:
        """Receive until an event of ``etype`` (matching ``pred``) arrives; an unexpected error fails."""
        while True:
            event = await self.recv()
            if event["type"] == etype and (pred is None or pred(event)):
                return event
            if event["type"] == "error" and etype != "error":
                raise AssertionError(f"unexpected error while waiting for {etype}: {event}")

    async def update(self, session: dict[str, Any]) -> dict[str, Any]:
        await self.send({"type": "session.update", "session": {"type": "realtime", **session}})
        return await self.until("session.updated")

    async def respond(self, **response: Any) -> list[dict[str, Any]]:
        """response.create, then every event up to and including its response.done."""
        start = len(self.events)
        await self.send({"type": "response.create", **({"response": response} if response else {})})
        await self.until("response.done")
        return self.events[start:]


class connect:
    """``async with connect(server) as rt`` opens /v1/realtime and reads session.created."""

    def __init__(self, server: Any, query: str = "", validate=validate_event, **kw: Any) -> None:
        self.url = f"{server.ws_url}/v1/realtime{query}"
        self.validate = validate
        self.kw = kw

    async def __aenter__(self) -> RT:
        self._cm = websockets.connect(self.url, max_size=None, open_timeout=60, **self.kw)
        ws = await self._cm.__aenter__()
        self.rt = RT(ws, self.validate)
        created = await self.rt.recv()
        assert created["type"] == "session.created", created
        return self.rt

    async def __aexit__(self, *exc: object) -> None:
        await self._cm.__aexit__(*exc)


def user_text(text: str) -> dict[str, Any]:
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def of_type(events: list[dict[str, Any]], *types: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] in types]


def audio_bytes(events: list[dict[str, Any]], etype: str = "response.output_audio.delta") -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in of_type(events, etype))


def roughness(x: np.ndarray) -> float:
    """Energy of the first difference over the energy: ~0.2-0.3 for speech at 8 kHz, ~0.55 for G.711 decoded
    with the other law, > 1 for PCM16 bytes read as G.711."""
    return float(np.mean(np.diff(x) ** 2) / max(1e-12, float(np.mean(x ** 2))))


# ---- turns ---------------------------------------------------------------------------------------------

async def test_text_only_turn_sdk(live_server):
    """The official SDK: a text item + response.create on a text-only session answers in text deltas only."""
    client = AsyncOpenAI(api_key="unused", websocket_base_url=f"{live_server.ws_url}/v1")
    events: list[dict] = []
    async with asyncio.timeout(120):
        async with client.realtime.connect(model="gpt-realtime") as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            await conn.conversation.item.create(item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT_QUESTION}]})
            await conn.response.create(response={"max_output_tokens": 24})
            async for event in conn:
                events.append(event.model_dump(mode="json", exclude_unset=True))
                if event.type == "response.done":
                    break
    for e in events:
        validate_event(e)
    types = [e["type"] for e in events]
    assert types[0] == "session.created"
    assert not of_type(events, "error"), of_type(events, "error")
    assert "session.updated" in types and "conversation.item.added" in types and "response.created" in types
    deltas = of_type(events, "response.output_text.delta")
    assert deltas, types
    assert not [t for t in types if "audio" in t], "a text-only session sent audio events"
    text = "".join(d["delta"] for d in deltas)
    assert of_type(events, "response.output_text.done")[0]["text"] == text
    done = events[-1]["response"]
    assert done["status"] == "completed", done
    assert done["output_modalities"] == ["text"]
    assert done["output"][0]["content"] == [{"type": "output_text", "text": text}]
    assert done["usage"]["output_tokens"] <= 24
    assert done["max_output_tokens"] == 24, "response.done reports the response's own token limit"
    assert text.strip(), "empty answer"


async def test_manual_commit_transcribes_then_answers(live_server, speech_samples):
    audio, sr, _ = speech_samples["capital"]
    async with asyncio.timeout(120), connect(live_server) as rt:
        await rt.update({"audio": {"input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}}})
        for chunk in pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.2, tail_s=0.3), chunk_ms=100):
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
        await rt.send({"type": "input_audio_buffer.commit", "event_id": "evt_commit_1"})
        committed = await rt.until("input_audio_buffer.committed")
        completed = await rt.until("conversation.item.input_audio_transcription.completed")
        assert completed["item_id"] == committed["item_id"]
        words = completed["transcript"].lower()
        assert "capital" in words and heard("france", words), completed
        await rt.until("conversation.item.done", lambda e: e["item"]["id"] == committed["item_id"])
        # no server VAD: nothing answers until the client asks
        assert not of_type(rt.events, "response.created", "input_audio_buffer.speech_started")
        turn = await rt.respond(max_output_tokens=32)
        types = [e["type"] for e in turn]
        assert "response.output_audio.delta" in types and "response.output_audio_transcript.delta" in types, types
        assert turn[-1]["response"]["status"] == "completed", turn[-1]
        pcm = audio_bytes(turn)
        assert len(pcm) % 2 == 0 and len(pcm) > 24000 * 2 * 0.3, len(pcm)

        # transcription off: the turn is still transcribed into the item, but no transcription events
        await rt.update({"audio": {"input": {"transcription": None}}})
        mark = len(rt.events)
        for chunk in pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.2, tail_s=0.3), chunk_ms=100):
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
        await rt.send({"type": "input_audio_buffer.commit"})
        committed = await rt.until("input_audio_buffer.committed")
        item_done = await rt.until("conversation.item.done", lambda e: e["item"]["id"] == committed["item_id"])
        assert heard("france", item_done["item"]["content"][0]["transcript"]), item_done
        assert not [e for e in rt.events[mark:] if e["type"].startswith("conversation.item.input_audio_transcription")]
    assert live_server.wait_idle()["total"] == 0


def speculative_count(metrics: str, outcome: str) -> float:
    prefix = f'omni_rt_speculative_responses_total{{outcome="{outcome}"}} '
    return next((float(line[len(prefix):]) for line in metrics.splitlines() if line.startswith(prefix)), 0.0)


async def test_server_vad_turns_with_a_pause_answer_once(live_server, speech_samples):
    """server_vad: a pause shorter than silence_duration_ms inside a turn (the server may start an answer from
    the transcript so far, and must drop it without a trace), then a plain turn: one answer per turn, in order."""
    (capital, sr, _), (color, sr2, _) = speech_samples["capital"], speech_samples["color"]
    assert sr == sr2
    pause = np.zeros(int(sr * 0.3), np.float32)
    paused_turn = pcm_chunks_b64(speech_with_silence(np.concatenate([capital, pause, color]), sr, tail_s=1.5))
    plain_turn = pcm_chunks_b64(speech_with_silence(capital, sr, tail_s=1.5))
    before = (await asyncio.to_thread(httpx.get, f"{live_server.http_url}/metrics", timeout=10)).text
    async with asyncio.timeout(180), connect(live_server) as rt:
        await rt.update({"max_output_tokens": 24, "audio": {"input": {
            "transcription": {"model": "whisper-1"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 900, "create_response": True}}}})
        for turn_audio, expect in ((paused_turn, ("france", "sky")), (plain_turn, ("france",))):
            start = len(rt.events)
            for chunk in turn_audio:
                await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
                await asyncio.sleep(0.02)  # twice real time
            done = await rt.until("response.done")
            turn = rt.events[start:]
            types = [e["type"] for e in turn]
            assert types.count("input_audio_buffer.speech_started") == 1, types
            assert types.count("input_audio_buffer.committed") == 1, types
            assert types.count("response.created") == 1, types
            transcript = of_type(turn, "conversation.item.input_audio_transcription.completed")[0]["transcript"].lower()
            assert all(heard(word, transcript) for word in expect), transcript
            rid = done["response"]["id"]
            assert done["response"]["status"] == "completed", done
            assert {e["response_id"] for e in turn if "response_id" in e} == {rid}, "events of another answer leaked"
            user_item = of_type(turn, "input_audio_buffer.committed")[0]["item_id"]
            assert types.index("conversation.item.input_audio_transcription.completed") < types.index("response.created")
            added = [e for e in of_type(turn, "conversation.item.added") if e["item"]["role"] == "assistant"]
            assert len(added) == 1 and added[0]["previous_item_id"] == user_item, added
            assert done["response"]["output"][0]["id"] == added[0]["item"]["id"]
    after = (await asyncio.to_thread(httpx.get, f"{live_server.http_url}/metrics", timeout=10)).text
    print(f"\nspeculative answers: released {speculative_count(after, 'released') - speculative_count(before, 'released'):.0f}, "
          f"discarded {speculative_count(after, 'discarded') - speculative_count(before, 'discarded'):.0f}")
    assert live_server.wait_idle()["total"] == 0


async def test_clear_and_delete(live_server, speech_samples):
    audio, sr, _ = speech_samples["color"]
    async with asyncio.timeout(60), connect(live_server) as rt:
        await rt.update({"audio": {"input": {"turn_detection": None}}})
        for chunk in pcm_chunks_b64(speech_with_silence(audio, sr), chunk_ms=100)[:10]:
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
        await rt.send({"type": "input_audio_buffer.clear"})
        await rt.until("input_audio_buffer.cleared")
        # the buffer really is empty now
        await rt.send({"type": "input_audio_buffer.commit"})
        err = await rt.until("error")
        assert err["error"]["code"] == "input_audio_buffer_commit_empty", err

        await rt.send({**user_text("first"), "event_id": "e1"})
        added = await rt.until("conversation.item.added")
        item_id = added["item"]["id"]
        await rt.send(user_text("second"))
        second = await rt.until("conversation.item.added")
        assert second["previous_item_id"] == item_id
        await rt.send({"type": "conversation.item.delete", "item_id": item_id})
        deleted = await rt.until("conversation.item.deleted")
        assert deleted["item_id"] == item_id
        await rt.send({"type": "conversation.item.delete", "item_id": item_id, "event_id": "evt_again"})
        err = await rt.until("error")
        assert err["error"]["code"] == "item_not_found" and err["error"]["event_id"] == "evt_again", err
        # a client-chosen id, inserted at the root
        await rt.send({"type": "conversation.item.create", "previous_item_id": "root",
                       "item": {"id": "item_mine", "type": "message", "role": "system",
                                "content": [{"type": "input_text", "text": "Be brief."}]}})
        mine = await rt.until("conversation.item.added")
        assert mine["item"]["id"] == "item_mine" and mine["previous_item_id"] is None
        await rt.update({"instructions": "still alive"})


@pytest.mark.parametrize("fmt", ["audio/pcmu", "audio/pcma"])
async def test_g711_in_and_out(live_server, speech_samples, fmt):
    audio, sr, _ = speech_samples["capital"]
    if fmt == "audio/pcmu":
        frames = ulaw_frames_b64(np.concatenate([audio, np.zeros(sr // 4, np.float32)]), sr)
        decode, other_law = ulaw_decode, alaw_decode
    else:
        x8 = resample(np.concatenate([audio, np.zeros(sr // 4, np.float32)]), sr, 8000)
        frames = [base64.b64encode(alaw_encode(x8[i:i + 160])).decode() for i in range(0, len(x8), 160)]
        decode, other_law = alaw_decode, ulaw_decode
    async with asyncio.timeout(120), connect(live_server) as rt:
        updated = await rt.update({"audio": {"input": {"format": {"type": fmt}, "turn_detection": None,
                                                       "transcription": {"model": "whisper-1"}},
                                             "output": {"format": {"type": fmt}}}})
        assert updated["session"]["audio"]["input"]["format"]["type"] == fmt
        assert updated["session"]["audio"]["output"]["format"]["type"] == fmt
        for frame in frames:
            await rt.send({"type": "input_audio_buffer.append", "audio": frame})
        await rt.send({"type": "input_audio_buffer.commit"})
        completed = await rt.until("conversation.item.input_audio_transcription.completed")
        assert heard("france", completed["transcript"]), completed  # the input was decoded as G.711
        turn = await rt.respond(max_output_tokens=32)
    assert turn[-1]["response"]["status"] == "completed", turn[-1]
    assert turn[-1]["response"]["audio"]["output"]["format"]["type"] == fmt
    wire = audio_bytes(turn)
    assert len(wire) > 8000 * 0.3, f"only {len(wire)} bytes of {fmt}"
    x = decode(wire)
    rms = float(np.sqrt(np.mean(x ** 2)))
    rough, rough_other = roughness(x), roughness(other_law(wire))
    print(f"{fmt}: {len(wire) / 8000:.2f} s of answer, rms {rms:.3f}, roughness {rough:.3f} (other law {rough_other:.3f})")
    # speech decoded with the right law is audible and smooth; the other law, or PCM16 bytes, would not be
    assert 0.01 < rms < 0.7, rms
    assert rough < 0.5 and rough < rough_other, (rough, rough_other)


async def test_beta_event_names(live_server):
    async with asyncio.timeout(120), connect(live_server, "?beta=1&model=gpt-4o-realtime-preview",
                                             validate=validate_ga_or_beta) as rt:
        await rt.send({"type": "session.update", "session": {"modalities": ["audio", "text"], "output_audio_format": "pcm16",
                                                            "input_audio_format": "g711_ulaw", "turn_detection": None}})
        updated = await rt.until("session.updated")
        assert updated["session"]["audio"]["input"]["format"]["type"] == "audio/pcmu"
        await rt.send(user_text(TEXT_QUESTION))
        turn = await rt.respond(max_output_tokens=16)
    types = {e["type"] for e in turn}
    assert {"conversation.item.created", "response.audio.delta", "response.audio_transcript.delta",
            "response.audio.done", "response.audio_transcript.done", "response.done"} <= types, types
    assert not {"response.output_audio.delta", "response.output_audio_transcript.delta", "conversation.item.added"} & types
    for e in turn:
        if e["type"] in ("response.audio.delta", "response.audio.done", "response.audio_transcript.delta",
                         "response.audio_transcript.done", "conversation.item.created"):
            validate_beta_event(e)
    assert len(audio_bytes(turn, "response.audio.delta")) > 0


async def test_healthz_and_metrics(live_server):
    async with httpx.AsyncClient(base_url=live_server.http_url, timeout=30) as http:
        health = await http.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        async with asyncio.timeout(60), connect(live_server):
            metrics = (await http.get("/metrics")).text
            open_sessions = next(float(line.split()[-1]) for line in metrics.splitlines()
                                 if line.startswith("omni_rt_active_sessions "))
            assert open_sessions >= 1, metrics
        metrics = (await http.get("/metrics")).text
    assert "omni_rt_ttfa_seconds_bucket" in metrics and "omni_rt_ttfa_seconds_count" in metrics
    assert "omni_rt_live_request_state" in metrics
    assert 'omni_rt_connections_total{outcome="accepted",surface="realtime"}' in metrics


# ---- bad input: an error event with a specific code, and the session lives on ----------------------------

B64_3_BYTES = base64.b64encode(b"\x00\x01\x02").decode()

BAD_INPUTS: list[tuple[str, list[Any], str]] = [
    ("bad_json", ["{this is not json"], "invalid_json"),
    ("json_not_object", ["[1, 2, 3]"], "invalid_json"),
    ("unknown_event", [{"type": "conversation.item.frobnicate", "event_id": "evt_x"}], "unknown_event"),
    ("no_type", [{"event_id": "evt_x"}], "missing_required_parameter"),
    ("append_without_audio", [{"type": "input_audio_buffer.append", "event_id": "evt_x"}], "missing_required_parameter"),
    ("update_without_session", [{"type": "session.update", "event_id": "evt_x"}], "missing_required_parameter"),
    ("delete_without_id", [{"type": "conversation.item.delete", "event_id": "evt_x"}], "missing_required_parameter"),
    ("item_without_content", [{"type": "conversation.item.create", "event_id": "evt_x",
                               "item": {"type": "message", "role": "user"}}], "missing_required_parameter"),
    ("bad_base64", [{"type": "input_audio_buffer.append", "audio": "@@not base64@@", "event_id": "evt_x"}], "invalid_base64"),
    ("odd_pcm_length", [{"type": "input_audio_buffer.append", "audio": B64_3_BYTES, "event_id": "evt_x"}], "invalid_audio"),
    ("append_too_large", [{"type": "input_audio_buffer.append", "event_id": "evt_x",
                           "audio": base64.b64encode(bytes(1_100_000)).decode()}], "audio_too_large"),
    ("truncate_unknown_item", [{"type": "conversation.item.truncate", "item_id": "item_nope", "content_index": 0,
                                "audio_end_ms": 0, "event_id": "evt_x"}], "item_not_found"),
    ("delete_unknown_item", [{"type": "conversation.item.delete", "item_id": "item_nope", "event_id": "evt_x"}], "item_not_found"),
    ("insert_after_unknown_item", [{**user_text("hi"), "previous_item_id": "item_nope", "event_id": "evt_x"}], "item_not_found"),
    ("unsupported_input_format", [{"type": "session.update", "event_id": "evt_x",
                                   "session": {"audio": {"input": {"format": {"type": "audio/flac"}}}}}], "unsupported_format"),
    ("unsupported_pcm_rate", [{"type": "session.update", "event_id": "evt_x",
                               "session": {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}}}], "unsupported_format"),
    ("unsupported_beta_format", [{"type": "session.update", "event_id": "evt_x",
                                  "session": {"input_audio_format": "opus"}}], "unsupported_format"),
    ("instructions_not_string", [{"type": "session.update", "session": {"instructions": 42}, "event_id": "evt_x"}], "invalid_type"),
    ("turn_detection_not_object", [{"type": "session.update", "event_id": "evt_x",
                                    "session": {"audio": {"input": {"turn_detection": "fast"}}}}], "invalid_type"),
    ("response_not_object", [{"type": "response.create", "response": "now please", "event_id": "evt_x"}], "invalid_type"),
    ("bad_modalities", [{"type": "session.update", "session": {"output_modalities": ["video"]}, "event_id": "evt_x"}], "invalid_value"),
    ("threshold_out_of_range", [{"type": "session.update", "event_id": "evt_x",
                                 "session": {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 7}}}}}],
     "invalid_value"),
    ("negative_audio_end_ms", [{"type": "conversation.item.truncate", "item_id": "item_nope", "content_index": 0,
                                "audio_end_ms": -5, "event_id": "evt_x"}], "invalid_value"),
    ("max_tokens_not_int", [{"type": "session.update", "session": {"max_output_tokens": "lots"}, "event_id": "evt_x"}], "invalid_value"),
    ("truncate_user_item", [user_text("hello"), {"type": "conversation.item.truncate", "item_id": "__last__",
                                                 "content_index": 0, "audio_end_ms": 0, "event_id": "evt_x"}], "invalid_value"),
    ("commit_empty_buffer", [{"type": "input_audio_buffer.commit", "event_id": "evt_x"}], "input_audio_buffer_commit_empty"),
    ("cancel_without_answer", [{"type": "response.cancel", "event_id": "evt_x"}], "response_cancel_not_active"),
    ("cancel_unknown_response", [{"type": "response.cancel", "response_id": "resp_nope", "event_id": "evt_x"}],
     "response_cancel_not_active"),
]


@pytest.mark.parametrize("messages,code", [pytest.param(m, c, id=name) for name, m, c in BAD_INPUTS])
async def test_bad_input_gets_error_and_session_lives_on(live_server, messages, code):
    async with asyncio.timeout(60), connect(live_server) as rt:
        for msg in messages:
            if isinstance(msg, dict) and msg.get("item_id") == "__last__":
                msg = {**msg, "item_id": of_type(rt.events, "conversation.item.added")[-1]["item"]["id"]}
                await rt.send(msg)
            elif isinstance(msg, dict) and msg is not messages[-1]:
                await rt.send(msg)
                await rt.until("conversation.item.added")
            else:
                await rt.send(msg)
        err = await rt.until("error")
        assert err["error"]["code"] == code, err
        assert err["error"]["message"], err
        last = messages[-1]
        if isinstance(last, dict) and "event_id" in last:
            assert err["error"]["event_id"] == last["event_id"], err
        # the session lives on: it still takes a valid update, and the bad one changed nothing
        updated = await rt.update({"instructions": "Answer briefly."})
        assert updated["session"]["instructions"] == "Answer briefly."
        assert updated["session"]["output_modalities"] == ["audio"]
        assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert updated["session"]["audio"]["input"]["turn_detection"]["threshold"] == 0.5
        assert not of_type(rt.events[rt.events.index(err) + 1:], "error")


async def test_binary_frame_is_an_error_not_a_crash(live_server):
    async with asyncio.timeout(60), connect(live_server) as rt:
        await rt.send(b"\xff\xfe\x00 binary")
        err = await rt.until("error")
        assert err["error"]["code"] == "invalid_json", err
        await rt.update({"instructions": "ok"})


async def test_oversized_message_closes_1009(live_server):
    """A message over the server's limit (default 2 MiB) closes the socket with 1009; the server serves on."""
    async with asyncio.timeout(60):
        async with websockets.connect(f"{live_server.ws_url}/v1/realtime", max_size=None) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            big = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (3 * 1024 * 1024)})
            await ws.send(big)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    event = json.loads(await ws.recv())
                    validate_event(event)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009, closed.value
        async with connect(live_server) as rt:
            await rt.update({"instructions": "still serving"})
    assert live_server.wait_idle()["total"] == 0
