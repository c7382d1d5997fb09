"""The talker computes clauses of all sessions earliest-due first (``StreamingSimpleScheduler.defer``): a new
answer's first clause goes ahead of the later clauses of an answer already playing, one answer's clauses stay in
order, its result follows its last clause, and an abort drops what it had queued. Real Piper, in process."""

from __future__ import annotations

import queue

import numpy as np

import pytest

from omni_rt.contracts.payloads import Clause, TextDelta
from omni_rt.pipeline.messages import IncomingMessage
from omni_rt.stages.talker.piper import create_piper_talker

LONG = "Paris is the capital. It sits on the Seine river in the north. It has about two million people living in it. " \
       "Its museums hold famous paintings from many centuries. Millions of visitors come every single year to see them."


@pytest.fixture(scope="module")
def talker():
    return create_piper_talker()


def feed(talker, rid: str, text: str) -> None:
    talker.inbox.put(IncomingMessage(request_id=rid, type="new_request", data={"text": text}))
    talker.inbox.put(IncomingMessage(request_id=rid, type="stream_chunk", data=TextDelta(text), source="thinker"))
    talker.inbox.put(IncomingMessage(request_id=rid, type="stream_done", source="thinker"))


def outputs(talker, until: set[str], timeout: float = 60) -> list[tuple[str, str, str]]:
    """(request, type, clause text or '') until every request in ``until`` has its result."""
    out = []
    while until:
        msg = talker.outbox.get(timeout=timeout)
        out.append((msg.request_id, msg.type, msg.data.text if isinstance(msg.data, Clause) else ""))
        if msg.type in ("result", "error"):
            until.discard(msg.request_id)
    return out


def long_then_new(talker) -> list[tuple[str, str, str]]:
    """A long answer's text, then a new answer's, both queued before the thread starts: the order is the
    scheduler's alone."""
    talker.set_stream_sources(["thinker"])
    feed(talker, "long", LONG)
    feed(talker, "new", "Blue is my favourite colour.")
    talker.start()
    try:
        return outputs(talker, {"long", "new"})
    finally:
        talker.stop()


def test_a_new_answers_first_clause_goes_ahead_of_a_long_answers_tail(talker):
    out = long_then_new(talker)
    spoken = [(rid, text) for rid, kind, text in out if kind == "stream"]
    long_clauses = [t for rid, t in spoken if rid == "long"]
    assert len(long_clauses) >= 4, spoken
    assert " ".join(long_clauses).split() == LONG.split(), long_clauses  # in order, nothing lost
    first_new = next(i for i, (rid, _) in enumerate(spoken) if rid == "new")
    assert first_new == 1, spoken  # right after the long answer's first clause, not after all of it (FIFO: 4+)
    for rid in ("long", "new"):  # each result after that request's last clause
        last_clause = max(i for i, (r, kind, _) in enumerate(out) if r == rid and kind == "stream")
        result = next(i for i, (r, kind, _) in enumerate(out) if r == rid and kind == "result")
        assert result > last_clause
        assert out[result][0] == rid


def test_an_abort_drops_the_clauses_it_had_queued(talker):
    talker.set_stream_sources(["thinker"])
    while not talker.outbox.empty():
        talker.outbox.get_nowait()
    feed(talker, "cut", LONG)
    talker.inbox.put(IncomingMessage(request_id="cut", type="abort"))  # the user talked over it
    feed(talker, "next", "Green.")
    talker.start()
    try:
        out = outputs(talker, {"next"})
        with pytest.raises(queue.Empty):
            talker.outbox.get(timeout=1.0)
    finally:
        talker.stop()
    assert [rid for rid, kind, _ in out if rid == "cut"] == [], out  # taken with its messages, before any synthesis
    assert talker.live_state() == 0


def test_arrival_order_is_the_ablation_it_names(talker):
    from omni_rt.stages.talker.piper import PiperTalker

    out = long_then_new(PiperTalker(talker.tts, clause_order="arrival"))
    spoken = [rid for rid, kind, _ in out if kind == "stream"]
    assert spoken.index("new") == spoken.count("long"), spoken  # the newcomer waits for the whole long answer


def test_a_streamed_first_clause_sends_its_start_first_and_keeps_each_answers_audio_in_order():
    """With ``first_piece_s`` an answer's first clause leaves in two pieces (its first 0.35 s, then the rest,
    ``continued``); a new answer's first piece goes ahead of the long answer's rest, and within each answer the
    rest comes before its next clause, the audio joining to the whole clause."""
    streaming = create_piper_talker(first_piece_s=0.35)
    tts = streaming.tts
    out = []
    streaming.set_stream_sources(["thinker"])
    feed(streaming, "long", LONG)
    feed(streaming, "new", "Blue is my favourite colour.")
    streaming.start()
    try:
        until = {"long", "new"}
        while until:
            msg = streaming.outbox.get(timeout=60)
            if msg.type == "stream":
                out.append((msg.request_id, msg.data))
            elif msg.type in ("result", "error"):
                until.discard(msg.request_id)
    finally:
        streaming.stop()
    order = [(rid, c.continued) for rid, c in out]
    assert order[:3] == [("long", False), ("new", False), ("long", True)], order  # the newcomer's start goes first
    for rid, text in (("long", LONG), ("new", "Blue is my favourite colour.")):
        clauses = [c for r, c in out if r == rid]
        assert clauses[1].continued and clauses[1].text == "" and not any(c.continued for c in clauses[2:]), order
        assert len(clauses[0].audio) == int(0.35 * tts.sample_rate / tts.hop) * tts.hop
        assert " ".join(c.text for c in clauses if c.text).split() == text.split()
        first_clause = np.concatenate([clauses[0].audio, clauses[1].audio])
        assert abs(len(first_clause) - len(tts.synthesize(clauses[0].text))) < tts.sample_rate // 2  # noisy voice: ~ length
    assert streaming.live_state() == 0
