"""The session's side of the backchannel filter (``omni_rt.stages.asr.interruption`` decides): it tells the audio-in
stage when an answer is heard (``AnswerStarted`` at its first audio, ``ResponseDone`` with ``played`` at its end),
sends nothing to the client for a candidate or a dropped backchannel (only ``PausePlayback`` for a transport that
paces), and treats the held ``SpeechStarted`` as any barge-in. The server's switch off: no ``AnswerStarted``."""

from __future__ import annotations

from rt_helpers import validate_event

from omni_rt.contracts import payloads as c
from omni_rt.session import commands as cmd
from omni_rt.session.core import RealtimeSession, SessionOptions


def drain(s: RealtimeSession) -> tuple[list[dict], list]:
    events, commands = s.events_to_send(), s.commands()
    for e in events:
        validate_event(e)
    return events, commands


def answering(options: SessionOptions | None = None) -> tuple[RealtimeSession, str]:
    s = RealtimeSession(options)
    s.open()
    s.receive_event({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                   "content": [{"type": "input_text", "text": "hi"}]}})
    s.receive_event({"type": "response.create"})
    rid = [x for x in drain(s)[1] if isinstance(x, cmd.StartResponse)][0].response_id
    return s, rid


def test_heard_answer_backchannel_then_interruption() -> None:
    s, rid = answering()
    s.receive_output(rid, "audio", c.PcmChunk(b"\x00\x01" * 2400, 2400))
    events, commands = drain(s)
    assert [x for x in commands if isinstance(x, cmd.AnswerStarted)], commands  # heard from its first audio
    s.receive_asr(c.InterruptionCandidate(1, 700))
    events, commands = drain(s)
    assert events == [] and [x.paused for x in commands if isinstance(x, cmd.PausePlayback)] == [True]
    s.receive_asr(c.BackchannelDropped(1, "Yeah.", 300.0, 520.0))
    events, commands = drain(s)
    assert events == [] and [x.paused for x in commands if isinstance(x, cmd.PausePlayback)] == [False]
    assert not [x for x in commands if isinstance(x, cmd.AbortResponse)] and s.response is not None  # it goes on
    s.receive_asr(c.InterruptionCandidate(1, 2000))
    s.receive_asr(c.SpeechStarted(1, 2000, decision_ms=450.0))
    events, commands = drain(s)
    types = [e["type"] for e in events]
    assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"
    assert [x.response_id for x in commands if isinstance(x, cmd.AbortResponse)] == [rid]
    ended = [x for x in commands if isinstance(x, cmd.ResponseDone)]
    assert len(ended) == 1 and ended[0].played is False  # cut short: heard no more


def test_completed_answer_is_heard_until_its_audio_has_played() -> None:
    s, rid = answering()
    s.receive_output(rid, "audio", c.PcmChunk(b"\x00\x01" * 24000, 24000))
    s.receive_result(rid, {})
    ended = [x for x in drain(s)[1] if isinstance(x, cmd.ResponseDone)]
    assert len(ended) == 1 and ended[0].played is True and ended[0].audio_ms == 1000


def test_server_switch_off_never_says_an_answer_is_heard() -> None:
    s, rid = answering(SessionOptions(backchannel_filter=False))
    s.receive_output(rid, "audio", c.PcmChunk(b"\x00\x01" * 2400, 2400))
    assert not [x for x in drain(s)[1] if isinstance(x, cmd.AnswerStarted)]
