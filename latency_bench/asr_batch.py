"""ASR throughput when several sessions commit at once: the CPU preset's faster-whisper tiny.en int8 behind the
real `AsrWorker`, for each ``max_batch`` (1 = one session at a time, as before batching).

    python -m latency_bench stages asr-batch [--sessions 4] [--max-batch 1 2 4] [--repeats 3]

Each round: every session commits one spoken question (Piper voice) at the same moment; we time until all
finals are out (wall) and each session's commit -> final (mean, max). Configs alternate per round; the best
round per config is kept (a shared machine's other load only ever slows a round down).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time

import numpy as np


def _round(sched, audios: list[np.ndarray]) -> dict[str, float]:
    from omni_rt.contracts.audio_in import CommitAudioIn
    from omni_rt.pipeline.messages import IncomingMessage

    sids = [f"s{i}" for i in range(len(audios))]
    t0 = time.perf_counter()
    for sid, audio in zip(sids, audios):
        sched.inbox.put(IncomingMessage(sid, "stream_chunk", audio))
        sched.inbox.put(IncomingMessage(sid, "new_request", CommitAudioIn()))
    done: dict[str, float] = {}
    while len(done) < len(sids):
        try:
            msg = sched.outbox.get(timeout=120)
        except queue.Empty as exc:
            raise RuntimeError(f"no transcript after 120 s; got {sorted(done)}") from exc
        if msg.type == "error":
            raise RuntimeError(f"{msg.request_id}: {msg.data}")
        if msg.type == "event" and type(msg.data).__name__ == "TranscriptFinal":
            done[msg.request_id] = time.perf_counter() - t0
    lat = list(done.values())
    return {"wall_s": max(lat), "mean_s": statistics.mean(lat)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--max-batch", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--repeats", type=int, default=3)


def command(args: argparse.Namespace) -> int:
    from omni_rt.audio.pcm import resample
    from omni_rt.backends.whisper import FasterWhisperASR
    from omni_rt.backends.tts_piper import PiperTTS
    from omni_rt.backends.vad import SileroVadModel
    from omni_rt.pipeline.messages import IncomingMessage
    from omni_rt.contracts.audio_in import AudioInSettings, OpenAudioIn
    from omni_rt.stages.asr.stage import AsrWorker

    tts = PiperTTS()
    texts = ["What is the capital of France?", "What color is the sky on a clear day?",
             "How far away is the moon from the earth?", "Tell me a story about a dragon who loved books."]
    audios = [resample(tts.synthesize(texts[i % len(texts)]), tts.sample_rate, 16000) for i in range(args.sessions)]
    asr, vad = FasterWhisperASR(), SileroVadModel()
    asr.transcribe(audios[0])  # warm-up
    scheds = {}
    for mb in args.max_batch:
        s = scheds[mb] = AsrWorker(asr, vad, max_batch=mb)
        s.start()
        for i in range(args.sessions):
            s.inbox.put(IncomingMessage(f"s{i}", "new_request", OpenAudioIn(AudioInSettings(None, partials=False))))
    rounds: dict[int, list[dict[str, float]]] = {mb: [] for mb in args.max_batch}
    try:
        for _ in range(args.repeats):
            for mb, s in scheds.items():
                rounds[mb].append(_round(s, audios))
    finally:
        for s in scheds.values():
            s.stop()
    print(f"{args.sessions} sessions commit at once; faster-whisper tiny.en int8, best of {args.repeats}")
    print(f"{'max_batch':>9} {'all done s':>11} {'mean final s':>13} {'commits/s':>10} {'batches':>8}")
    for mb in args.max_batch:
        best = min(rounds[mb], key=lambda r: r["wall_s"])
        st = scheds[mb].stats()
        print(f"{mb:>9} {best['wall_s']:>11.3f} {best['mean_s']:>13.3f} {args.sessions / best['wall_s']:>10.2f} "
              f"{st['decode_batches']:>8}")
    return 0
