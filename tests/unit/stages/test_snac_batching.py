"""Issue #15 item 3: many SNAC streams decoded in one batch per step give the same PCM as each stream decoded
alone (window invariance survives padding and batching), and the vocoder stage batches, stays idle-immediate
and sends each result after its audio. Random-init SNAC with the 24 kHz layout, narrow enough for 2 cores."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest

from omni_rt.pipeline.messages import IncomingMessage
from omni_rt.contracts.payloads import CodecFrames

# small_snac: tests/conftest.py

def _alone(model, frames: np.ndarray, chunks: list[int], **kw) -> np.ndarray:
    from omni_rt.backends.snac_codec import SnacStreamingDecoder

    dec, out, at = SnacStreamingDecoder(model, **kw), [], 0
    for k in chunks:
        out.append(dec.push_many(frames[at : at + k]))
        at += k
    out.append(dec.flush())
    return np.concatenate(out)


@pytest.mark.parametrize("window_frames", [None, 5])  # exact margins (padded batch) / approximate (grouped by length)
def test_batched_windows_equal_each_stream_alone(small_snac, window_frames) -> None:
    from omni_rt.backends.snac_codec import (
        SnacStreamingDecoder,
        decode_frames,
        decode_windows,
    )

    rng = np.random.default_rng(7)
    kw = {} if window_frames is None else {"window_frames": window_frames}
    # streams of different lengths and chunkings; some end mid-run while others go on, one is shorter than a window
    plans = [[1] * 14, [3, 1, 1, 4, 2, 1, 1], [2], [1, 1, 1, 1, 1, 1], [5, 5, 1]]
    frames = [rng.integers(0, 4096, (sum(p), 7)) for p in plans]
    decs = [SnacStreamingDecoder(small_snac, **kw) for _ in plans]
    outs: list[list[np.ndarray]] = [[] for _ in plans]
    pos, step_idx = [0] * len(plans), [0] * len(plans)
    live = set(range(len(plans)))
    forwards_per_step = []
    while live:
        windows, owners = [], []
        for i in sorted(live):
            if step_idx[i] < len(plans[i]):  # this stream's next chunk arrives
                k = plans[i][step_idx[i]]
                decs[i].add(frames[i][pos[i] : pos[i] + k])
                pos[i] += k
                step_idx[i] += 1
            final = step_idx[i] == len(plans[i])  # ends with its last chunk: mid-run for the shorter ones
            w = decs[i].plan(final=final, max_new_frames=3)  # a small cap: bursts spread over several steps
            if w is not None:
                windows.append(w)
                owners.append(i)
        audios, forwards = decode_windows(small_snac, windows)
        forwards_per_step.append((len(windows), forwards))
        for i, w, a in zip(owners, windows, audios, strict=True):
            (solo,), _ = decode_windows(small_snac, [w])  # the same window decoded in a batch of one
            np.testing.assert_allclose(a, solo, atol=1e-5 * max(1e-3, np.abs(solo).max()))
            outs[i].append(decs[i].commit(w, a))
        live = {i for i in live if step_idx[i] < len(plans[i]) or decs[i].backlog}
    assert any(n >= 3 for n, _ in forwards_per_step), forwards_per_step  # several streams shared steps
    if window_frames is None:  # exact margins: windows of different lengths still share one forward
        assert any(n >= 3 and f == 1 for n, f in forwards_per_step), forwards_per_step
    for i, p in enumerate(plans):
        batched = np.concatenate(outs[i])
        assert len(batched) == len(frames[i]) * 2048
        if window_frames is None:  # exact margins: any chunking, batched or not, is the one-shot decode
            alone = _alone(small_snac, frames[i], p)
            full = decode_frames(small_snac, frames[i])
            np.testing.assert_allclose(batched, alone, atol=1e-5 * np.abs(alone).max())
            np.testing.assert_allclose(batched, full, atol=1e-5 * np.abs(full).max())


def _collect(voc, want_results: int, timeout: float = 60.0) -> list:
    out, deadline = [], time.monotonic() + timeout
    while sum(m.type in ("result", "error") for m in out) < want_results:
        assert time.monotonic() < deadline, [m.type for m in out]
        try:
            out.append(voc.outbox.get(timeout=0.5))
        except queue.Empty:
            pass
    return out


def test_vocoder_stage_batches_streams_and_matches_alone(small_snac) -> None:
    from omni_rt.stages.vocoder import SnacVocoder

    rng = np.random.default_rng(11)
    lengths = [9, 4, 13, 2, 7, 10]
    frames = {f"r{i}": rng.integers(0, 4096, (n, 7)) for i, n in enumerate(lengths)}
    voc = SnacVocoder(small_snac, max_step_frames=2)
    voc.set_stream_sources(["talker"])
    # a talker at batch 6: one frame per stream per step, queued before the stage runs so steps batch them
    for t in range(max(lengths)):
        for rid, f in frames.items():
            if t < len(f):
                voc.inbox.put(IncomingMessage(rid, "stream_chunk", CodecFrames(f[t : t + 1]), source="talker"))
            elif t == len(f):
                voc.inbox.put(IncomingMessage(rid, "stream_done", None, source="talker"))
                voc.inbox.put(IncomingMessage(rid, "new_request", {"text": rid}))
    for rid, f in frames.items():
        if len(f) == max(lengths):
            voc.inbox.put(IncomingMessage(rid, "stream_done", None, source="talker"))
            voc.inbox.put(IncomingMessage(rid, "new_request", {"text": rid}))
    voc.start()
    try:
        out = _collect(voc, len(frames))
    finally:
        voc.stop()
    assert not [m for m in out if m.type == "error"], [m.data for m in out if m.type == "error"]
    for rid, f in frames.items():
        mine = [m for m in out if m.request_id == rid]
        assert mine[-1].type == "result" and all(m.type == "stream" for m in mine[:-1])  # result after its audio
        pcm = np.concatenate([np.frombuffer(m.data.pcm, dtype=np.int16) for m in mine[:-1]])
        assert mine[-1].data["output_samples"] == len(pcm) == len(f) * 2048
        from omni_rt.audio.pcm import float_to_pcm16

        alone = np.frombuffer(float_to_pcm16(_alone(small_snac, f, [1] * len(f))), dtype=np.int16)
        assert np.abs(pcm.astype(np.int32) - alone).max() <= 1  # the same PCM, up to one LSB of rounding
    stats = voc.stats()
    assert stats["windows"] > stats["steps"] and stats["max_batch"] >= 4, stats  # the batch path was taken
    assert stats["forwards"] < stats["windows"], stats
    assert voc.live_state() == 0


def test_lone_stream_decodes_at_once_and_abort_drops_it(small_snac) -> None:
    from omni_rt.stages.vocoder import SnacVocoder

    voc = SnacVocoder(small_snac)
    voc.set_stream_sources(["talker"])
    voc.start()
    try:
        f = np.random.default_rng(3).integers(0, 4096, (4, 7))
        voc.inbox.put(IncomingMessage("solo", "stream_chunk", CodecFrames(f), source="talker"))
        msg = voc.outbox.get(timeout=30)  # nothing else arrives: a batching window would wait here forever
        assert msg.type == "stream" and msg.data.samples > 0
        bad = np.full((1, 7), 4096)
        voc.inbox.put(IncomingMessage("bad", "stream_chunk", CodecFrames(bad), source="talker"))
        err = voc.outbox.get(timeout=30)
        assert err.type == "error" and err.request_id == "bad" and "[0, 4096)" in err.data
        voc.abort("solo")
        deadline = time.monotonic() + 10
        while voc.live_state() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert voc.live_state() == 0
    finally:
        voc.stop()


def test_vocoder_bench_runs_tiny(capsys) -> None:
    """``latency_bench stages vocoder``'s before/after table, at a tiny width so it stays a smoke run."""
    from latency_bench.vocoder_bench import main

    main(["--streams", "1", "3", "--frames", "4", "--decoder-dim", "16", "--repeats", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [ln.split() for ln in lines[2:]]
    assert [r[0] for r in rows] == ["1", "3"] and all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows), lines
    assert rows[1][5] == "3"  # after: the three streams shared one decode
