"""The GPT-Live layer, sans-I/O, on a fake clock: the real-time output stream (exact sample counts, digital zeros
in each format), transcripts released as their audio plays, barge-in, the speech queue, delegation from the
core's function call, usage, close drain and expiry."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from omni_rt.session.live import DELEGATE_TOOL, LiveLimits, LiveSession


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def started(fmt=None, policy="always", **limits) -> tuple[LiveSession, Clock]:
    clock = Clock()
    live = LiveSession(voices=("joe",), delegation_policy=policy, limits=LiveLimits(**limits), clock=clock, wall=lambda: 1e9 + clock.t)
    session = {"model": "gpt-live-1", **({"audio": {"format": fmt}} if fmt else {})}
    live.receive_message(json.dumps({"type": "session.start", "event_id": "s", "session": session}))
    assert [e["type"] for e in live.events_to_send()] == ["session.started"]
    return live, clock


def audio_out(events) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "session.output_audio.delta")


def core_audio(pcm: np.ndarray) -> dict:
    return {"type": "response.output_audio.delta", "delta": base64.b64encode(pcm.astype("<i2").tobytes()).decode()}


@pytest.mark.parametrize("fmt,rate,bps,zero", [(None, 24000, 2, 0), ({"type": "audio/pcm", "rate": 16000}, 16000, 2, 0),
                                              ({"type": "audio/pcmu"}, 8000, 1, 0xFF), ({"type": "audio/pcma"}, 8000, 1, 0xD5)])
def test_stream_is_real_time_and_silent(fmt, rate, bps, zero):
    live, clock = started(fmt, output_lead_s=0.0)
    out = []
    for _ in range(50):  # 2 s in 40 ms ticks
        clock.t += 0.04
        live.tick()
        out += live.events_to_send()
    data = audio_out(out)
    assert len(data) == int(2.0 * rate) * bps
    assert set(data) == {zero}
    assert live.core_session["audio"]["input"]["turn_detection"] == {"type": "semantic_vad"}


def test_answer_audio_then_zeros_and_transcript_follows_playback():
    live, clock = started(output_lead_s=0.0)
    live.receive_core([{"type": "response.created", "response": {"id": "r1"}},
                       {"type": "response.output_audio_transcript.delta", "delta": "Hello"},
                       core_audio(np.full(2400, 1000)),  # 100 ms
                       {"type": "response.output_audio_transcript.delta", "delta": " there"},
                       core_audio(np.full(2400, 2000))])
    clock.t += 0.04
    live.tick()
    first = live.events_to_send()
    assert [e["delta"] for e in first if e["type"] == "session.output_transcript.delta"] == ["Hello"]
    for _ in range(10):
        clock.t += 0.04
        live.tick()
        first += live.events_to_send()
    texts = [e for e in first if e["type"] == "session.output_transcript.delta"]
    assert [e["delta"] for e in texts] == ["Hello", " there"]
    assert texts[0]["start_ms"] == 0 and texts[0]["end_ms"] == 100 and texts[1]["start_ms"] == 100
    pcm = np.frombuffer(audio_out(first), np.int16)
    assert (pcm[:2400] == 1000).all() and (pcm[2400:4800] == 2000).all() and not pcm[4800:].any()


def test_barge_in_drops_unplayed_audio():
    live, clock = started(output_lead_s=0.0)
    live.receive_core([core_audio(np.full(24000, 500)), {"type": "response.output_audio_transcript.delta", "delta": "late"}])
    clock.t += 0.04
    live.tick()
    assert np.frombuffer(audio_out(live.events_to_send()), np.int16).all()  # playing
    live.receive_core([{"type": "input_audio_buffer.speech_started", "audio_start_ms": 0}])
    clock.t += 0.2
    live.tick()
    events = live.events_to_send()
    assert not np.frombuffer(audio_out(events), np.int16).any()
    assert not [e for e in events if e["type"] == "session.output_transcript.delta"]


def test_delegation_result_and_speech_queue():
    live, clock = started()
    assert live.core_session["tool_choice"] == "required" and live.core_session["tools"][0]["name"] == DELEGATE_TOOL
    live.receive_core([{"type": "response.created", "response": {"id": "r1"}},
                       {"type": "response.done", "response": {"id": "r1", "output": [
                           {"type": "function_call", "name": DELEGATE_TOOL, "call_id": "call_1"}]}}])
    created = [e for e in live.events_to_send() if e["type"] == "session.delegation.created"]
    assert len(created) == 1 and created[0]["delegation"]["target"] == "client"
    did = created[0]["delegation"]["id"]
    live.receive_core([{"type": "response.created", "response": {"id": "r2"}}])  # a new turn's answer is playing
    live.receive_message(json.dumps({"type": "session.commentary.append", "event_id": "c", "content": "Paris.", "delegation_id": did}))
    assert live.core_events() == []  # waits for the answer in progress
    assert [e["type"] for e in live.events_to_send()] == ["session.commentary.appended"]
    live.receive_core([{"type": "response.done", "response": {"id": "r2", "output": []}}])
    sent = live.core_events()
    assert sent[0]["item"] == {"type": "function_call_output", "call_id": "call_1", "output": "Paris."}
    assert sent[1]["type"] == "response.create" and sent[1]["response"]["tool_choice"] == "none"
    assert all(e["event_id"] == "live:c" for e in sent)
    live.receive_core([{"type": "error", "error": {"code": "invalid_value", "message": "bad", "param": "item", "event_id": "live:c"}}])
    err = live.events_to_send()[0]
    assert err["type"] == "error" and err["client_event_id"] == "c" and err["error"]["code"] == "invalid_value"


def test_usage_close_drain_and_expiry():
    live, clock = started(usage_interval_s=1.0, drain_timeout_s=2.0, lifetime_s=30.0)
    clock.t += 1.05
    live.tick()
    usage = [e for e in live.events_to_send() if e["type"] == "session.usage.updated"]
    assert usage and usage[0]["usage"]["seconds"] == pytest.approx(1.05)
    live.receive_core([{"type": "response.created", "response": {"id": "r1"}}])
    live.receive_message(json.dumps({"type": "session.close", "event_id": "bye"}))
    live.tick()
    assert not live.finished  # the voice is still answering
    live.receive_message(json.dumps({"type": "session.input_audio.mute"}))
    assert live.events_to_send()[-1]["error"]["code"] == "session_closing"
    clock.t += 2.1
    live.tick()  # the drain gives up after drain_timeout_s
    closed = live.events_to_send()[-1]
    assert live.finished and closed["type"] == "session.closed" and closed["reason"] == "close_requested"
    assert closed["client_event_id"] == "bye"
    other, clock2 = started(lifetime_s=30.0)
    clock2.t += 31
    other.tick()
    assert other.finished and other.events_to_send()[-1]["reason"] == "expired"


def test_mute_feeds_silence_and_16k_input_is_resampled():
    live, _ = started({"type": "audio/pcm", "rate": 16000})
    loud = base64.b64encode(np.full(1600, 3000, np.int16).tobytes()).decode()
    live.receive_message(json.dumps({"type": "session.input_audio.append", "audio": loud}))
    sent = live.core_events()
    assert sent and len(base64.b64decode(sent[0]["audio"])) // 2 > 1600  # 16 kHz -> 24 kHz
    live.receive_message(json.dumps({"type": "session.input_audio.mute"}))
    live.receive_message(json.dumps({"type": "session.input_audio.append", "audio": loud}))
    muted = np.frombuffer(base64.b64decode(live.core_events()[0]["audio"]), np.int16)
    assert len(muted) > 1600 and np.abs(muted[len(muted) // 2:]).max() < 100  # (the resampler's lag: the loud tail first)


def test_commentary_refused_as_busy_waits_then_goes():
    live, _ = started()
    live.receive_message(json.dumps({"type": "session.commentary.append", "event_id": "g", "content": "Hi!", "delegation_id": None}))
    first = live.core_events()
    assert [e["type"] for e in first] == ["response.create"]
    # a turn's answer won the race: the core refuses ours; it waits for that answer and then goes again
    live.receive_core([{"type": "response.created", "response": {"id": "turn"}},
                       {"type": "error", "error": {"code": "conversation_already_has_active_response", "message": "busy",
                                                   "event_id": "live:g"}}])
    assert live.core_events() == [] and not [e for e in live.events_to_send() if e["type"] == "error"]
    live.receive_core([{"type": "response.done", "response": {"id": "turn", "output": []}}])
    assert live.core_events() == first


def test_events_queued_for_a_client_that_does_not_read_are_capped():
    live, _ = started(max_queued_events=10)
    for _ in range(50):
        live.receive_message("{bad json")
    assert live.overflow and len(live.events_to_send()) == 10


def test_responses_request_ends_with_the_users_words_not_the_preamble():
    """The voice's preamble for a delegation is spoken (and noted) before the response that delegates ends: the
    backend's request leaves it out and ends with the user's words. A request ending on the voice's own words got
    a placeholder user turn, and a small backend apologised instead of answering."""
    clock = Clock()
    live = LiveSession(voices=("joe",), delegation_policy="always", limits=LiveLimits(output_lead_s=0.0), clock=clock,
                       wall=lambda: 1e9 + clock.t, responses_backend=True)
    live.receive_message(json.dumps({"type": "session.start", "event_id": "s", "session": {"model": "gpt-live-1", "delegation": {
        "type": "responses", "responses": {"model": "m", "instructions": "Be brief."}}}}))
    assert [e["type"] for e in live.events_to_send()] == ["session.started"]
    live.receive_core([{"type": "conversation.item.input_audio_transcription.completed", "transcript": "What is the capital of France?"},
                       {"type": "response.created", "response": {"id": "r1"}},
                       {"type": "response.output_audio_transcript.delta", "delta": "Let me check that."},
                       core_audio(np.full(2400, 1000))])
    for _ in range(5):  # the preamble plays
        clock.t += 0.04
        live.tick()
    live.receive_core([{"type": "response.done", "response": {"id": "r1", "output": [
        {"type": "function_call", "name": DELEGATE_TOOL, "call_id": "call_1"}]}}])
    [job] = live.take_backend_jobs()
    assert job.body["messages"] == [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "What is the capital of France?"}]
