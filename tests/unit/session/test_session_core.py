"""The sans-I/O session core on its own: audio-in events in any order, server events and commands out.

No sockets and no models: the session is a state machine, so the orderings a live pipeline produces only
sometimes (a transcript that returns after the next turn began) are driven here deterministically. Every
server event is validated against openai-python's GA models.
"""

from __future__ import annotations

from rt_helpers import validate_event

from omni_rt.session import commands as cmd
from omni_rt.session.core import RealtimeSession, SessionOptions
from omni_rt.session.response_state import ResponseState
from omni_rt.contracts import payloads as c


def drain(s: RealtimeSession) -> tuple[list[dict], list]:
    events, commands = s.events_to_send(), s.commands()
    for e in events:
        validate_event(e)
    return events, commands


def accept_updates(s: RealtimeSession) -> list:
    """Play the audio-in stage: accept every ``UpdateAudioIn`` queued so far; the other commands are returned."""
    rest = []
    for x in s.commands():
        if isinstance(x, cmd.UpdateAudioIn):
            s.receive_asr(c.AudioInUpdated(0, x.update_id))
        else:
            rest.append(x)
    return rest


def opened() -> RealtimeSession:
    s = RealtimeSession()
    s.open()
    s.receive_event({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}})
    accept_updates(s)
    drain(s)
    return s


def test_late_transcript_lands_on_its_own_turn() -> None:
    s = opened()
    s.receive_asr(c.SpeechStarted(1, 100))
    s.receive_asr(c.SpeechStopped(1, 900))
    s.receive_asr(c.Committed(1, "vad", 800))
    s.receive_asr(c.SpeechStarted(2, 1200))  # the user talks again before turn 1 is transcribed
    s.receive_asr(c.TranscriptFinal(1, "first question", False, 300.0, 400.0, 800))
    s.receive_asr(c.SpeechStopped(2, 2000))
    s.receive_asr(c.Committed(2, "vad", 800))
    s.receive_asr(c.TranscriptFinal(2, "second question", False, 300.0, 300.0, 800))
    events, commands = drain(s)
    started = {e["item_id"] for e in events if e["type"] == "input_audio_buffer.speech_started"}
    item1, item2 = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    assert started == {item1, item2} and item1 != item2
    completed = {e["item_id"]: e["transcript"] for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"}
    assert completed == {item1: "first question", item2: "second question"}
    assert s.conversation.get(item1).text() == "first question" and s.conversation.get(item2).text() == "second question"
    # turn 1 was superseded by turn 2 before its transcript came: one answer, for turn 2, seeing both turns
    starts = [x for x in commands if isinstance(x, cmd.StartResponse)]
    assert len(starts) == 1
    assert [m["content"] for m in starts[0].payload["messages"][1:]] == ["first question", "second question"]


def test_commit_burst_gives_each_commit_its_own_item() -> None:
    s = opened()
    for i in range(5):
        s.receive_event({"type": "input_audio_buffer.commit", "event_id": f"c{i}"})
    for turn in range(1, 6):
        s.receive_asr(c.Committed(turn, "commit", 500))
    for turn in (3, 1, 5, 2, 4):  # decodes return out of order
        s.receive_asr(c.TranscriptFinal(turn, f"turn {turn}", False, 100.0, 100.0, 500))
    events, _ = drain(s)
    assert not [e for e in events if e["type"] == "error"], events
    committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    assert len(set(committed)) == 5
    assert [s.conversation.get(i).text() for i in committed] == [f"turn {t}" for t in range(1, 6)]


def test_held_answer_released_or_discarded_without_a_trace() -> None:
    s = opened()
    s.receive_asr(c.SpeechStarted(1, 0))
    s.receive_asr(c.TranscriptSpeculative(1, "what time is it", 200.0))
    events, commands = drain(s)
    held = [x for x in commands if isinstance(x, cmd.StartResponse)]
    assert len(held) == 1 and not [e for e in events if e["type"].startswith("response.")]
    s.receive_output(held[0].response_id, "text", c.TextDelta("It is noon."))
    assert not [e for e in drain(s)[0] if e["type"].startswith("response.")]  # still held: nothing on the wire
    s.receive_asr(c.SpeechStopped(1, 900))
    s.receive_asr(c.Committed(1, "vad", 900))
    s.receive_asr(c.TranscriptFinal(1, "what time is it", True, 0.0, 0.0, 900))
    events, commands = drain(s)
    types = [e["type"] for e in events]
    assert "response.created" in types and "response.output_audio_transcript.delta" in types
    assert not [x for x in commands if isinstance(x, cmd.StartResponse)]  # released, not restarted
    assert s.response is not None and s.response.id == held[0].response_id and s.response.state is ResponseState.ACTIVE

    # speech resumes in turn 2 after a guess: the new guess is dropped silently, its computation aborted
    s.receive_result(held[0].response_id, {"prompt_tokens": 10, "completion_tokens": 4})
    drain(s)
    s.receive_asr(c.SpeechStarted(2, 2000))
    s.receive_asr(c.TranscriptSpeculative(2, "and tomorrow", 200.0))
    guess = [x for x in drain(s)[1] if isinstance(x, cmd.StartResponse)][0]
    s.receive_asr(c.SpeculationCancelled(2))
    events, commands = drain(s)
    assert not [e for e in events if e["type"].startswith("response.")]
    assert [x.response_id for x in commands if isinstance(x, cmd.AbortResponse)] == [guess.response_id]
    assert s.live_state()["responses"] == 0


def test_barge_in_cancels_and_purges_queued_audio() -> None:
    s = opened()
    s.receive_event({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                   "content": [{"type": "input_text", "text": "hi"}]}})
    s.receive_event({"type": "response.create"})
    rid = [x for x in drain(s)[1] if isinstance(x, cmd.StartResponse)][0].response_id
    s.receive_output(rid, "audio", c.PcmChunk(b"\x00\x01" * 2400, 2400))  # queued, not yet sent
    s.receive_asr(c.SpeechStarted(1, 500))
    events, commands = drain(s)
    types = [e["type"] for e in events]
    assert "response.output_audio.delta" not in types  # purged: the listener hears nothing more of it
    assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"
    assert [x.response_id for x in commands if isinstance(x, cmd.AbortResponse)] == [rid]
    s.receive_output(rid, "audio", c.PcmChunk(b"\x00\x01" * 2400, 2400))  # a late chunk of the aborted answer
    assert not drain(s)[0]


def test_parallel_tool_calls_become_function_call_items() -> None:
    s = opened()
    s.receive_event({"type": "session.update", "session": {"type": "realtime", "tools": [
        {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}})
    s.receive_event({"type": "response.create"})
    events, commands = drain(s)
    start = next(x for x in commands if isinstance(x, cmd.StartResponse))
    assert start.payload["tools"][0]["name"] == "get_time" and start.payload["tool_choice"] == "auto"
    rid = start.response_id
    for index, city in ((0, "Paris"), (1, "Rome")):
        s.receive_output(rid, "text", c.ToolCallDelta(index, f"call_{index}", "get_time", '{"city": '))
    for index, city in ((0, "Paris"), (1, "Rome")):
        s.receive_output(rid, "text", c.ToolCallDelta(index, f"call_{index}", "get_time", f'"{city}"}}'))
        s.receive_output(rid, "text", c.ToolCallDone(index, f"call_{index}", "get_time", f'{{"city": "{city}"}}'))
    s.receive_result(rid, {"prompt_tokens": 5, "completion_tokens": 9})
    events, _ = drain(s)
    done = next(e for e in events if e["type"] == "response.done")["response"]
    calls = [o for o in done["output"] if o["type"] == "function_call"]
    assert [(o["call_id"], o["arguments"]) for o in calls] == [("call_0", '{"city": "Paris"}'), ("call_1", '{"city": "Rome"}')]
    arg_done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [e["output_index"] for e in arg_done] == [0, 1]
    # a response that only calls tools carries no (empty) assistant message item
    assert [o["type"] for o in done["output"]] == ["function_call", "function_call"]
    assert not [e for e in events if e["type"].startswith(("response.content_part", "response.output_audio"))]
    added = [e["item"]["type"] for e in events if e["type"] in ("response.output_item.added", "conversation.item.added")]
    assert added == ["function_call"] * 4, added
    # the history the next answer sees: one assistant message with both calls, then each output
    for i, out in enumerate(("09:00", "10:00")):
        s.receive_event({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": f"call_{i}", "output": out}})
    s.receive_event({"type": "response.create"})
    start = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse))
    msgs = start.payload["messages"]
    assert [m["role"] for m in msgs[-3:]] == ["assistant", "tool", "tool"] and len(msgs[-3]["tool_calls"]) == 2


def test_session_tool_choice_may_come_before_its_tools() -> None:
    """LiveKit's realtime plugin sends ``tool_choice: required`` in its first session.update and its tools in the
    next: the first is accepted (echoed), and every response resolves the choice against the tools it then has."""
    s = opened()
    s.receive_event({"type": "session.update", "event_id": "tc", "session": {"type": "realtime", "tool_choice": "required"}})
    events, _ = drain(s)
    assert not [e for e in events if e["type"] == "error"], events
    assert next(e for e in events if e["type"] == "session.updated")["session"]["tool_choice"] == "required"
    s.receive_event({"type": "response.create"})  # no tools yet: a plain answer
    start = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse))
    assert "tools" not in start.payload and "tool_choice" not in start.payload
    s.receive_event({"type": "response.cancel"})
    s.receive_result(start.response_id, {"prompt_tokens": 1, "completion_tokens": 0})
    drain(s)
    tool = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
    s.receive_event({"type": "session.update", "session": {"type": "realtime", "tools": [tool]}})
    s.receive_event({"type": "response.create"})
    start = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse))
    assert start.payload["tools"][0]["name"] == "get_time" and start.payload["tool_choice"] == "required"
    s.receive_event({"type": "response.cancel"})
    s.receive_result(start.response_id, {"prompt_tokens": 1, "completion_tokens": 0})
    drain(s)
    # a response states its tools and choice at once: there the choice must fit them
    s.receive_event({"type": "response.create", "event_id": "bad", "response": {"tools": [], "tool_choice": "required"}})
    err = next(e for e in drain(s)[0] if e["type"] == "error")
    assert err["error"]["param"] == "response.tool_choice" and err["error"]["event_id"] == "bad", err


def test_function_call_only_response_event_sequence() -> None:
    """The GA sequence of a response that only calls a tool, and of one that speaks after a call: the message
    item is announced with its first text, at the output index after the call."""
    s = opened()
    s.receive_event({"type": "session.update", "session": {"type": "realtime", "tools": [
        {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}})
    s.receive_event({"type": "response.create"})
    rid = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse)).response_id
    s.receive_output(rid, "text", c.ToolCallDelta(0, "call_0", "get_time", '{"city": "Paris"}'))
    s.receive_output(rid, "text", c.ToolCallDone(0, "call_0", "get_time", '{"city": "Paris"}'))
    s.receive_result(rid, {"prompt_tokens": 5, "completion_tokens": 9})
    events, _ = drain(s)
    assert [e["type"] for e in events] == [  # (response.created went out with the response.create)
        "response.output_item.added", "conversation.item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "conversation.item.done", "response.done"]
    s.receive_event({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "call_0", "output": "09:00"}})
    s.receive_event({"type": "response.create"})
    rid = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse)).response_id
    s.receive_output(rid, "text", c.ToolCallDelta(0, "call_1", "get_time", '{"city": "Rome"}'))
    s.receive_output(rid, "text", c.ToolCallDone(0, "call_1", "get_time", '{"city": "Rome"}'))
    s.receive_output(rid, "text", c.TextDelta("It is nine.", []))
    s.receive_result(rid, {})
    events, _ = drain(s)
    message = [e for e in events if e.get("item_id") and e["type"].startswith("response.output_audio")]
    assert message and {e["output_index"] for e in message} == {1}
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert [o["type"] for o in done["output"]] == ["function_call", "message"]
    assert done["output"][1]["content"][0]["transcript"] == "It is nine."
    # an answer with nothing in it (no text, no call) still has its message item, as before
    s.receive_event({"type": "response.create"})
    rid = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse)).response_id
    s.receive_result(rid, {})
    done = next(e for e in drain(s)[0] if e["type"] == "response.done")["response"]
    assert [o["type"] for o in done["output"]] == ["message"]


def test_held_answer_that_calls_a_tool_joins_the_history_without_a_message() -> None:
    s = opened()
    s.receive_event({"type": "session.update", "session": {"type": "realtime", "tools": [
        {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}})
    drain(s)
    s.receive_asr(c.SpeechStarted(1, 0))
    s.receive_asr(c.TranscriptSpeculative(1, "what time is it in Rome", 200.0))
    rid = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse)).response_id
    s.receive_output(rid, "text", c.ToolCallDelta(0, "call_0", "get_time", '{"city": "Rome"}'))
    s.receive_output(rid, "text", c.ToolCallDone(0, "call_0", "get_time", '{"city": "Rome"}'))
    s.receive_asr(c.SpeechStopped(1, 900))
    s.receive_asr(c.Committed(1, "vad", 900))
    s.receive_asr(c.TranscriptFinal(1, "what time is it in Rome", True, 0.0, 0.0, 900))
    s.receive_result(rid, {})
    events, _ = drain(s)
    user = next(e for e in events if e["type"] == "input_audio_buffer.committed")["item_id"]
    added = [e for e in events if e["type"] == "conversation.item.added" and e["item"]["id"] != user]
    assert [(e["item"]["type"], e["previous_item_id"]) for e in added] == [("function_call", user)]
    assert [it.type for it in s.conversation.items] == ["message", "function_call"]
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert [o["type"] for o in done["output"]] == ["function_call"]


def test_transcription_session_transcribes_and_never_answers() -> None:
    s = RealtimeSession()
    s.open()
    s.receive_event({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "transcription": {"model": "gpt-4o-mini-transcribe"}}}}})
    accept_updates(s)
    s.receive_asr(c.SpeechStarted(1, 0))
    s.receive_asr(c.TranscriptSpeculative(1, "hello there", 100.0))
    s.receive_asr(c.SpeechStopped(1, 800))
    s.receive_asr(c.Committed(1, "vad", 800))
    s.receive_asr(c.TranscriptFinal(1, "hello there", True, 0.0, 0.0, 800))
    s.receive_event({"type": "response.create"})
    events, commands = drain(s)
    assert events[0]["session"]["type"] == "realtime" and any(e.get("session", {}).get("type") == "transcription" for e in events)
    assert [e["transcript"] for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"] == ["hello there"]
    assert not [x for x in commands if isinstance(x, cmd.StartResponse)]
    assert [e["error"]["param"] for e in events if e["type"] == "error"] == ["type"]


# ------------------------------------------------------------------------------------------------ session.update
SEMANTIC = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}}


def test_session_updated_follows_the_stage_and_stays_in_order() -> None:
    """A change the audio-in stage owns is confirmed once the stage holds it; one it does not own is confirmed
    at once, unless an earlier confirmation is still waiting (then after it, in order)."""
    s = RealtimeSession()
    s.open()
    drain(s)
    s.receive_event({"type": "session.update", "session": {"instructions": "Be brief."}})
    events, commands = drain(s)
    assert [e["type"] for e in events] == ["session.updated"] and not commands
    s.receive_event(SEMANTIC)
    s.receive_event({"type": "session.update", "session": {"instructions": "Be briefer."}})
    events, commands = drain(s)
    updates = [x for x in commands if isinstance(x, cmd.UpdateAudioIn)]
    assert events == [] and len(updates) == 1 and updates[0].settings.turn_detection.type == "semantic_vad"
    assert s.config.instructions == "Be briefer."  # in force at once: the client's next events see it
    s.receive_asr(c.AudioInUpdated(0, updates[0].update_id))
    events, _ = drain(s)
    assert [e["type"] for e in events] == ["session.updated", "session.updated"]
    assert all(e["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad" for e in events)


def test_a_setting_the_stage_refuses_keeps_the_old_one() -> None:
    s = RealtimeSession()
    s.open()
    drain(s)
    s.receive_event({"type": "session.update", "session": {"instructions": "Hi.", **SEMANTIC["session"]}})
    (update,) = [x for x in s.commands() if isinstance(x, cmd.UpdateAudioIn)]
    assert s.events_to_send() == []
    s.receive_asr(c.AudioInUpdateRefused(0, update.update_id, "turn_model_unavailable", "asr: semantic_vad needs the Smart Turn model"))
    events, _ = drain(s)
    assert [e["type"] for e in events] == ["error", "session.updated"], events
    err = events[0]["error"]
    assert err["code"] == "turn_model_unavailable" and err["param"] == "session.audio.input.turn_detection", err
    assert events[1]["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert s.config.turn_detection.type == "server_vad" and s.config.instructions == "Hi."
    s.receive_event(SEMANTIC)  # asked again: sent again (the stage still holds server_vad)
    assert [x for x in s.commands() if isinstance(x, cmd.UpdateAudioIn)]



def test_partials_stream_the_words_two_re_decodes_agree_on() -> None:
    """Each partial re-decodes the whole turn: the words two consecutive partials agree on (case and punctuation
    aside, the newest one's last word never) go out as deltas while the user talks, even when a re-decode
    changed an already-sent word ("what" -> "What"); a partial's unstable tail ("cap?") never does, and nothing
    is sent twice (LiveKit's GPT-Live client ends the user's speech after 0.8 s without a delta)."""
    s = opened()
    s.receive_asr(c.SpeechStarted(1, 0))
    for text in ("what is", "What is the cap?", "What is the capital of", "what is the capital of France"):
        s.receive_asr(c.TranscriptPartial(1, text))
    deltas = [e["delta"] for e in drain(s)[0] if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert deltas == ["What is", " the", " capital of"], deltas
    s.receive_asr(c.SpeechStopped(1, 2000))
    s.receive_asr(c.Committed(1, "vad", 2000))
    s.receive_asr(c.TranscriptFinal(1, "What is the capital of France?", False, 0.0, 0.0, 2000))
    done = next(e for e in drain(s)[0] if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert done["transcript"] == "What is the capital of France?"


def test_the_thinker_hears_each_next_prompt_ahead() -> None:
    """Prefill hints (``cmd.PrefillHint``): while the user speaks, the answer's prompt as far as it is heard
    (the conversation and the words so far); after an answer, the next one's start (the conversation and an
    empty user turn). A hint is the very payload its answer will get but for the user's last words, so the
    thinker's cache holds that answer's prefix when the turn ends. A server without speculative answers
    sends none."""
    s = opened()
    s.receive_asr(c.SpeechStarted(1, 0))
    s.receive_asr(c.TranscriptPartial(1, "what time"))
    hints = [x for x in drain(s)[1] if isinstance(x, cmd.PrefillHint)]
    assert len(hints) == 1 and hints[0].payload["messages"][-1] == {"role": "user", "content": "what time"}
    s.receive_asr(c.SpeechStopped(1, 900))
    s.receive_asr(c.Committed(1, "vad", 900))
    s.receive_asr(c.TranscriptFinal(1, "what time is it", False, 0.0, 0.0, 900))
    start = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse))
    assert start.payload["messages"][-1] == {"role": "user", "content": "what time is it"}
    assert {**hints[0].payload, "messages": None} == {**start.payload, "messages": None}  # same session, budget
    assert hints[0].payload["messages"][:-1] == start.payload["messages"][:-1]
    s.receive_output(start.response_id, "text", c.TextDelta("It is noon."))
    s.receive_result(start.response_id, {"prompt_tokens": 10, "completion_tokens": 4})
    after = [x for x in drain(s)[1] if isinstance(x, cmd.PrefillHint)]
    assert [h.payload["messages"][-2:] for h in after] == [[{"role": "assistant", "content": "It is noon."},
                                                          {"role": "user", "content": ""}]]
    assert after[0].payload["messages"][:-2] == start.payload["messages"]

    quiet = RealtimeSession(SessionOptions(speculative_responses=False))
    quiet.open()
    quiet.receive_event({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}})
    accept_updates(quiet)
    quiet.receive_asr(c.SpeechStarted(1, 0))
    quiet.receive_asr(c.TranscriptPartial(1, "what time"))
    assert not [x for x in drain(quiet)[1] if isinstance(x, cmd.PrefillHint)]


TIME_TOOL = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def test_spoken_answers_ask_for_a_preamble_unless_the_instructions_or_the_server_say_no() -> None:
    s = opened()
    s.receive_event({"type": "session.update", "session": {"type": "realtime", "tools": [TIME_TOOL]}})
    s.receive_event({"type": "response.create"})
    start = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse))
    assert start.payload["tool_preamble"] == "auto"
    s.receive_event({"type": "response.cancel"})
    s.receive_event({"type": "response.create", "response": {"output_modalities": ["text"]}})  # nothing to speak it
    start = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse))
    assert "tool_preamble" not in start.payload
    s.receive_event({"type": "response.cancel"})
    s.receive_event({"type": "response.create", "response": {"instructions": "Be brief. No tool preamble."}})
    start = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse))
    assert "tool_preamble" not in start.payload
    assert start.payload["messages"][0] == {"role": "system", "content": "Be brief."}  # the switch is not for the model
    off = RealtimeSession(SessionOptions(tool_preamble="off"))
    off.open()
    off.receive_event({"type": "session.update", "session": {"type": "realtime", "tools": [TIME_TOOL]}})
    off.receive_event({"type": "response.create"})
    assert "tool_preamble" not in next(x for x in drain(off)[1] if isinstance(x, cmd.StartResponse)).payload


def test_preamble_then_call_items_and_the_pending_call_across_another_answer() -> None:
    """The preamble is the message item (index 0) before the call (index 1); while the call is pending another
    question is answered; the late output is answered with the history in order, the preamble and its call
    one assistant turn."""
    s = opened()
    s.receive_event({"type": "session.update", "session": {"type": "realtime", "tools": [TIME_TOOL]}})
    s.receive_event({"type": "response.create"})
    rid = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse)).response_id
    s.receive_output(rid, "text", c.TextDelta("Let me check that.", []))
    s.receive_output(rid, "text", c.ToolCallDelta(0, "call_0", "get_time", '{"city": "Rome"}'))
    s.receive_output(rid, "text", c.ToolCallDone(0, "call_0", "get_time", '{"city": "Rome"}'))
    s.receive_output(rid, "audio", c.PcmChunk(b"\0\0" * 480, 480))
    s.receive_result(rid, {})
    events, _ = drain(s)
    added = [(e["output_index"], e["item"]["type"]) for e in events if e["type"] == "response.output_item.added"]
    assert added == [(0, "message"), (1, "function_call")]
    audio = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert audio and {e["output_index"] for e in audio} == {0}
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert [o["type"] for o in done["output"]] == ["message", "function_call"]
    # another question while the call is pending: answered at once
    s.receive_event({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                  "content": [{"type": "input_text", "text": "And the date?"}]}})
    s.receive_event({"type": "response.create"})
    events, commands = drain(s)
    assert not [e for e in events if e["type"] == "error"], events
    rid = next(x for x in commands if isinstance(x, cmd.StartResponse)).response_id
    s.receive_output(rid, "text", c.TextDelta("It is Monday.", []))
    s.receive_result(rid, {})
    drain(s)
    # the late output, then the answer that uses it
    s.receive_event({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "call_0", "output": "09:00"}})
    s.receive_event({"type": "response.create"})
    msgs = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse)).payload["messages"]
    assert [(m["role"], m["content"]) for m in msgs[-4:]] == [
        ("assistant", "Let me check that."), ("user", "And the date?"), ("assistant", "It is Monday."), ("tool", "09:00")]
    assert msgs[-4]["tool_calls"][0]["id"] == "call_0"


def test_parallel_tool_calls_false_keeps_only_the_first_call() -> None:
    s = opened()
    s.receive_event({"type": "session.update", "session": {"type": "realtime", "tools": [TIME_TOOL], "parallel_tool_calls": False}})
    s.receive_event({"type": "response.create"})
    rid = next(x for x in drain(s)[1] if isinstance(x, cmd.StartResponse)).response_id
    for index, city in ((0, "Paris"), (1, "Rome")):
        s.receive_output(rid, "text", c.ToolCallDelta(index, f"call_{index}", "get_time", f'{{"city": "{city}"}}'))
        s.receive_output(rid, "text", c.ToolCallDone(index, f"call_{index}", "get_time", f'{{"city": "{city}"}}'))
    s.receive_result(rid, {})
    done = next(e for e in drain(s)[0] if e["type"] == "response.done")["response"]
    assert [o["call_id"] for o in done["output"]] == ["call_0"]
