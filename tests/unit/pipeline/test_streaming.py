"""Experiment 3: a talker streaming codes to a vocoder, and every ordering of chunks / stream_done / payload."""

from __future__ import annotations

import asyncio

import pytest

from omni_rt.pipeline.config import PipelineConfig
from omni_rt.pipeline.coordinator import ResultItem, StreamItem
from omni_rt.pipeline.messages import IncomingMessage

try:  # the repo root is on sys.path (python -m pytest / PYTHONPATH=.)
    from tests import toy_stages as toy
except ImportError:  # bare `pytest`: pytest put tests/ itself on sys.path
    import toy_stages as toy  # type: ignore[no-redef]
poll_until, running = toy.poll_until, toy.running

TOML = f"""
name = "talker-vocoder"
entry = "talker"

[[stages]]
name = "talker"
factory = "{toy.M}:create_talker"
next = "vocoder"
stream_to = ["vocoder"]

[[stages]]
name = "vocoder"
factory = "{toy.M}:create_vocoder"
terminal = true
can_accept_stream_before_payload = true

[stages.args]
decode_delay = 0.0
"""


async def _collect(coord, rid: str, payload: dict) -> tuple[list[StreamItem], ResultItem, list]:
    chunks: list[StreamItem] = []
    result = None
    kinds = []
    async for item in coord.stream(rid, payload):
        kinds.append(type(item).__name__)
        if isinstance(item, StreamItem):
            chunks.append(item)
        else:
            result = item
    assert result is not None
    return chunks, result, kinds


async def test_talker_streams_to_vocoder_from_toml(tmp_path):
    path = tmp_path / "stream.toml"
    path.write_text(TOML)
    cfg = PipelineConfig.from_file(path)
    async with running(cfg) as coord:
        chunks, result, kinds = await asyncio.wait_for(
            _collect(coord, "r1", {"text": "say something", "steps": 4, "step_delay": 0.05}), 10
        )
        assert kinds == ["StreamItem"] * 4 + ["ResultItem"]  # the final result comes after all chunks
        assert [c.data["step"] for c in chunks] == [0, 1, 2, 3]
        assert chunks[0].data["samples"] == [100, 200] and chunks[1].data["samples"] == [1100, 1200]
        assert all(c.stage == "vocoder" and c.metadata == {"modality": "audio"} for c in chunks)
        assert result.stage == "vocoder" and result.data["total_samples"] == 8
        assert result.data["payload"] == {"num_steps": 4, "text": "say something"}
        # the vocoder started before its payload: chunks and stream_done, then the payload
        assert result.data["order"] == ["chunk0", "chunk1", "chunk2", "chunk3", "done:talker", "payload", "complete"]
        # chunks were streamed while the talker was still generating (not all at the end)
        assert chunks[-1].t - chunks[0].t > 0.05
        assert await poll_until(lambda: coord.live_total() == 0)


async def test_first_stream_output_reports_its_wait_and_compute():
    """A streaming stage's first output of a request carries a StageTiming (inbox wait, then the time from taking
    the message to the output) to the coordinator, which hands it over with the result; the client-visible
    chunks keep their own metadata only."""
    async with running(toy.stream_config(vocoder_args={"decode_delay": 0.03})) as coord:
        chunks, result, _ = await asyncio.wait_for(_collect(coord, "r1", {"text": "x", "steps": 3, "step_delay": 0.01}), 10)
        assert all("timing" not in c.metadata for c in chunks)
        assert set(result.timings) == {"vocoder"}  # the toy talker is no streaming scheduler: it reports nothing
        t = result.timings["vocoder"]
        assert t.queue_s >= 0.0
        assert t.compute_s >= 0.03  # it slept that long before emitting its first chunk
        assert await poll_until(lambda: coord.live_total() == 0)


async def test_two_concurrent_streams_do_not_mix():
    async with running(toy.stream_config()) as coord:
        (c1, r1, _), (c2, r2, _) = await asyncio.wait_for(
            asyncio.gather(_collect(coord, "a", {"steps": 3, "text": "a"}), _collect(coord, "b", {"steps": 5, "text": "b"})),
            10,
        )
        assert [c.data["step"] for c in c1] == [0, 1, 2] and r1.data["payload"]["text"] == "a"
        assert [c.data["step"] for c in c2] == [0, 1, 2, 3, 4] and r2.data["payload"]["text"] == "b"
        assert await poll_until(lambda: coord.live_total() == 0)


# ---- orderings, scheduler driven directly ----------------------------------------------------------
def _chunk(rid: str, step: int, source: str = "talker") -> IncomingMessage:
    return IncomingMessage(rid, "stream_chunk", {"codes": [step], "step": step}, source)


ORDERINGS = {
    "done_before_payload": (["c0", "c1", "done", "payload"], ["chunk0", "chunk1", "done:talker", "payload"]),
    "payload_before_chunks": (["payload", "c0", "c1", "done"], ["payload", "chunk0", "chunk1", "done:talker"]),
    "chunks_before_payload": (["c0", "payload", "c1", "done"], ["chunk0", "payload", "chunk1", "done:talker"]),
    "no_chunks_done_first": (["done", "payload"], ["done:talker", "payload"]),
}


@pytest.mark.parametrize("ordering", list(ORDERINGS))
def test_streaming_scheduler_orderings_direct(ordering):
    steps, expected = ORDERINGS[ordering]
    voc = toy.create_vocoder()
    voc.stream_sources = ["talker"]
    voc.start()
    try:
        for i, step in enumerate(steps):
            if step == "payload":
                msg = IncomingMessage("r", "new_request", {"p": 1})
            elif step == "done":
                msg = IncomingMessage("r", "stream_done", None, "talker")
            else:
                msg = _chunk("r", int(step[1:]))
            voc.inbox.put(msg)
            if i < len(steps) - 1:
                # no result before the last of (payload, every stream_done) has arrived
                outs = toy.drain(voc.outbox, 0.05)
                assert all(o.type == "stream" for o in outs), outs
        final = voc.outbox.get(timeout=3)
        while final.type == "stream":
            final = voc.outbox.get(timeout=3)
        assert final.type == "result"
        assert final.data["order"] == expected + ["complete"]
        assert final.data["payload"] == {"p": 1}
        assert voc.live_state() == 0
    finally:
        voc.stop()


def test_streaming_scheduler_waits_for_every_stream_source_direct():
    voc = toy.create_vocoder()
    voc.stream_sources = ["a", "b"]
    voc.start()
    try:
        voc.inbox.put(IncomingMessage("r", "new_request", {}))
        voc.inbox.put(_chunk("r", 0, "a"))
        voc.inbox.put(IncomingMessage("r", "stream_done", None, "a"))
        voc.inbox.put(_chunk("r", 1, "b"))
        assert [o.type for o in toy.drain(voc.outbox, 0.1)] == ["stream", "stream"]
        voc.inbox.put(IncomingMessage("r", "stream_done", None, "b"))
        assert voc.outbox.get(timeout=3).type == "result"
        # abort drops a half-built request's state
        voc.inbox.put(_chunk("x", 0, "a"))
        voc.inbox.put(IncomingMessage("x", "abort"))
        toy.drain(voc.outbox, 0.1)
        assert voc.live_state() == 0 and voc.aborted_states == 1
    finally:
        voc.stop()


# ---- orderings through the pipeline ---------------------------------------------------------------
TWO_PATH = {
    # payload path slow: chunks and stream_done reach the vocoder long before its payload
    "chunks_and_done_before_payload": (
        {"steps": 3, "payload_delay": 0.25},
        ["chunk0", "chunk1", "chunk2", "done:talker", "payload", "complete"],
    ),
    # talker slow to start: the payload is there before the first chunk
    "payload_before_chunks": (
        {"steps": 3, "start_delay": 0.25},
        ["payload", "chunk0", "chunk1", "chunk2", "done:talker", "complete"],
    ),
}


@pytest.mark.parametrize("case", list(TWO_PATH))
async def test_orderings_through_pipeline(case):
    payload, expected = TWO_PATH[case]
    async with running(toy.two_path_config()) as coord:
        chunks, result, kinds = await asyncio.wait_for(_collect(coord, case, {"text": case, **payload}), 10)
        assert kinds == ["StreamItem"] * 3 + ["ResultItem"]
        assert [c.data["step"] for c in chunks] == [0, 1, 2] and all(c.stage == "vocoder" for c in chunks)
        voc = result.data["vocoder"]
        assert voc["order"] == expected
        assert voc["payload"] == {"via": "delay", "text": case}
        assert result.data["talker"] == {"num_steps": 3, "text": case}
        assert await poll_until(lambda: coord.live_total() == 0)


async def test_shell_buffers_chunks_until_payload_when_target_cannot_accept_early():
    """can_accept_stream_before_payload=false: the shell holds chunks (and stream_done) until the payload."""
    async with running(toy.two_path_config(can_accept_stream_before_payload=False)) as coord:
        task = asyncio.ensure_future(
            _collect(coord, "buf", {"text": "buf", "steps": 3, "payload_delay": 0.4})
        )
        voc_stage = coord.stages["vocoder"]
        # the talker is done long before the payload: the chunks wait in the shell, not in the scheduler
        assert await poll_until(lambda: len(voc_stage.stream_buffer.get("buf", [])) == 4, timeout=3)
        assert "buf" not in voc_stage.scheduler.orders
        assert coord.live_state()["stages"]["vocoder"]["stream_buffers"] == 1
        chunks, result, _ = await asyncio.wait_for(task, 10)
        assert result.data["vocoder"]["order"] == ["payload", "chunk0", "chunk1", "chunk2", "done:talker", "complete"]
        assert [c.data["step"] for c in chunks] == [0, 1, 2]
        assert await poll_until(lambda: coord.live_total() == 0)


async def test_shell_buffering_on_the_direct_talker_vocoder_chain():
    async with running(toy.stream_config(can_accept_stream_before_payload=False)) as coord:
        chunks, result, kinds = await asyncio.wait_for(
            _collect(coord, "r", {"steps": 3, "step_delay": 0.02}), 10
        )
        # chunks were held until the payload, then delivered after it (so they reach the client after it too)
        assert result.data["order"] == ["payload", "chunk0", "chunk1", "chunk2", "done:talker", "complete"]
        assert kinds == ["StreamItem"] * 3 + ["ResultItem"]
        assert await poll_until(lambda: coord.live_total() == 0)
