"""Per-stage latency of the CPU preset, in-process with the real backends (no server, no sockets).

For a ~3 s spoken question (Piper-generated) and the stage args of ``models/cpu.yaml``:

* ASR final after end of speech — the VAD's ``speech_stopped`` decision -> ``transcript.final``, with the
  speculative decode in the end-of-turn silence (the preset) and without it (the naive way); plus what the
  speculative decode itself costs while the user is silent;
* thinker first token and first clause (the talker's first 2-5 word clause), the AR scheduler from
  ``omni_rt.engine.factory.create_ar_scheduler("smollm2")``; a second turn with and without prefix reuse;
* talker first audio: Piper on that first clause;
* vocoder: the PCM vocoder on that clause's audio (first 200 ms chunk, and per chunk).

Run: ``python -m latency_bench stages [--repeats 5] [--out latency_bench/results/stages.json]``. Its parts alone:
``stages asr-batch`` (ASR batching), ``stages vocoder`` (SNAC vocoder batching), ``stages overhead`` (the
pipeline runtime's own cost).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from latency_bench import report
from omni_rt.contracts.audio_in import AudioInSettings, OpenAudioIn
from omni_rt.contracts.turn_detection import parse_turn_detection
from omni_rt.contracts.payloads import Clause, SpeechStopped, TranscriptFinal

UTTERANCE = "What is the capital of France, and what is it famous for?"
FOLLOW_UP = "And how many people live there?"
OUT = report.RESULTS_DIR / "stages.json"


def _row(stage: str, values: list[float], note: str = "") -> dict[str, Any]:
    s = report.summarize(values)
    return {"stage": stage, "p50": s["p50"], "p95": s["p95"], "max": s["max"], "n": s["n"], "note": note,
            "values_ms": [round(v, 1) for v in values]}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------- ASR
def measure_asr(asr_args: dict[str, Any], audio16: np.ndarray, repeats: int) -> tuple[list[dict[str, Any]], str]:
    """The real ASR stage, started, fed 20 ms chunks in real time: speech_stopped -> transcript.final."""
    import queue

    from omni_rt.pipeline.messages import IncomingMessage
    from omni_rt.stages.asr.factory import create_asr_stage

    spec_after = int(asr_args.get("speculative_alone_after_ms") or asr_args.get("speculative_after_ms", 150))  # one session
    sched = create_asr_stage(**asr_args)
    sched.transcriber.transcribe(audio16)  # warm
    sched.start()
    lead, tail = np.zeros(4800, np.float32), np.zeros(16000, np.float32)  # 0.3 s before, 1 s after
    stream = np.concatenate([lead, audio16, tail])
    step = 320  # 20 ms at 16 kHz
    rows: list[dict[str, Any]] = []
    text = ""
    try:
        for label, after_ms in (("speculative", spec_after), ("no_speculative", 100000)):
            sched.speculative_after_ms = sched.speculative_alone_after_ms = after_ms
            finals, decodes = [], []
            for r in range(repeats):
                sid = f"bench-{label}-{r}"
                sched.inbox.put(IncomingMessage(sid, "new_request", OpenAudioIn(AudioInSettings(
                    parse_turn_detection({"type": "server_vad", "silence_duration_ms": 500}), partials=False))))
                t_stop = got = None
                t_start = time.perf_counter()
                for k, i in enumerate(range(0, len(stream), step)):
                    time.sleep(max(0.0, t_start + k * 0.02 - time.perf_counter()))  # real-time pacing
                    sched.inbox.put(IncomingMessage(sid, "stream_chunk", stream[i: i + step]))
                    while got is None:
                        try:
                            msg = sched.outbox.get_nowait()
                        except queue.Empty:
                            break
                        ev = msg.data if msg.type == "event" else None
                        if isinstance(ev, SpeechStopped):
                            t_stop = time.perf_counter()
                        elif isinstance(ev, TranscriptFinal):
                            got = ((time.perf_counter() - (t_stop or time.perf_counter())) * 1000, ev)
                deadline = time.perf_counter() + 10
                while got is None and time.perf_counter() < deadline:
                    msg = sched.outbox.get(timeout=10)
                    ev = msg.data if msg.type == "event" else None
                    if isinstance(ev, SpeechStopped):
                        t_stop = time.perf_counter()
                    elif isinstance(ev, TranscriptFinal):
                        got = ((time.perf_counter() - (t_stop or time.perf_counter())) * 1000, ev)
                sched.abort(sid)
                if got is None:
                    raise RuntimeError(f"ASR ({label}): no final transcript for the test utterance")
                finals.append(got[0])
                if got[1].asr_ms:
                    decodes.append(float(got[1].asr_ms))
                text = got[1].text
            if label == "speculative":
                rows.append(_row("ASR final after speech_stopped (decode started in the silence)", finals,
                                 f"decode starts at {after_ms} ms of silence, on a worker; turn ends at 500 ms"))
                if decodes:
                    rows.append(_row("  the decode itself", decodes, "Whisper tiny.en, window = speech + 5 s (>= 15 s)"))
            else:
                rows.append(_row("ASR final after speech_stopped (decode after the turn)", finals, "whisper on the whole turn"))
    finally:
        sched.stop()
    return rows, text


# ------------------------------------------------------------------------------------------------- thinker
class Thinker:
    def __init__(self, args: dict[str, Any]) -> None:
        from omni_rt.engine.factory import create_ar_scheduler

        self.sched = create_ar_scheduler(**args)
        self.sched.start()

    def ask(self, messages: list[dict[str, str]], session_id: str | None, max_tokens: int = 96) -> dict[str, Any]:
        from omni_rt.pipeline.messages import IncomingMessage
        from omni_rt.stages.talker.clause_splitter import ClauseSplitter

        rid = f"bench-{uuid.uuid4().hex[:8]}"
        splitter = ClauseSplitter(first_min_words=2, first_max_words=4)
        out: dict[str, Any] = {"first_token_ms": None, "first_clause_ms": None, "first_clause": None, "text": "", "tokens": 0}
        t0 = time.perf_counter()
        self.sched.inbox.put(IncomingMessage(rid, "new_request", {"messages": messages, "session_id": session_id,
                                                                   "max_tokens": max_tokens}))
        t_first = None
        while True:
            msg = self.sched.outbox.get(timeout=300)
            now = time.perf_counter()
            if msg.request_id != rid:
                continue
            if msg.type == "error":
                raise RuntimeError(f"thinker: {msg.data}")
            if msg.type == "stream":
                delta = msg.data.text
                out["tokens"] += len(msg.data.token_ids) or 1
                if delta and t_first is None:
                    t_first = now
                    out["first_token_ms"] = (now - t0) * 1000
                out["text"] += delta
                clauses = splitter.push(delta) if delta else []
                if clauses and out["first_clause"] is None:
                    out["first_clause"], out["first_clause_ms"] = clauses[0], (now - t0) * 1000
            elif msg.type == "result":
                out["total_ms"] = (now - t0) * 1000
                if out["first_clause"] is None:
                    rest = splitter.flush()
                    out["first_clause"], out["first_clause_ms"] = (rest[0] if rest else out["text"]), out["total_ms"]
                if isinstance(msg.data, dict):
                    out["cached_tokens"] = msg.data.get("cached_tokens")
                    out["prompt_tokens"] = msg.data.get("prompt_tokens")
                    out["tokens"] = msg.data.get("completion_tokens") or out["tokens"]
                if t_first is not None and out["tokens"] > 1:
                    out["decode_ms_per_token"] = (now - t_first) * 1000 / (out["tokens"] - 1)
                return out

    def stop(self) -> None:
        self.sched.stop()


def measure_thinker(args: dict[str, Any], transcript: str, repeats: int) -> tuple[list[dict[str, Any]], str]:
    from omni_rt.realtime.session_config import SessionConfig

    system = {"role": "system", "content": SessionConfig().instructions}
    th = Thinker(args)
    try:
        th.ask([system, {"role": "user", "content": "Hello."}], None, max_tokens=8)  # warm
        first, clause, per_tok, turn2_reuse, turn2_full, cached = [], [], [], [], [], []
        first_clause = ""
        answer = ""
        for r in range(repeats):
            sid = f"bench-sess-{uuid.uuid4().hex[:6]}"
            msgs = [system, {"role": "user", "content": transcript}]
            a = th.ask(msgs, sid)
            first.append(a["first_token_ms"])
            clause.append(a["first_clause_ms"])
            if a.get("decode_ms_per_token"):
                per_tok.append(a["decode_ms_per_token"])
            first_clause, answer = a["first_clause"], a["text"]
            msgs2 = msgs + [{"role": "assistant", "content": a["text"]}, {"role": "user", "content": FOLLOW_UP}]
            th.sched.prefix_reuse = True
            b = th.ask(msgs2, sid, max_tokens=4)
            turn2_reuse.append(b["first_token_ms"])
            cached.append(b.get("cached_tokens") or 0)
            th.sched.prefix_reuse = False
            c = th.ask(msgs2, f"{sid}-cold", max_tokens=4)
            turn2_full.append(c["first_token_ms"])
            th.sched.prefix_reuse = args.get("prefix_reuse", True)
        # idle-immediate admission vs a batching window that starts with a lone request (same scheduler,
        # interleaved so load drift hits both alike)
        from latency_bench.ablations import WINDOW_MS

        idle_imm, windowed = [], []
        for r in range(repeats):
            msgs = [system, {"role": "user", "content": transcript}]
            th.sched.batch_wait_s, th.sched.batch_wait_when_idle = 0.0, False
            idle_imm.append(th.ask(msgs, None, max_tokens=2)["first_token_ms"])
            th.sched.batch_wait_s, th.sched.batch_wait_when_idle = WINDOW_MS / 1000.0, True
            windowed.append(th.ask(msgs, None, max_tokens=2)["first_token_ms"])
        th.sched.batch_wait_s, th.sched.batch_wait_when_idle = 0.0, False
        rows = [
            _row("thinker first token (turn 1)", first, "prefill of system + question"),
            _row("thinker first clause (turn 1)", clause, f"first clause: {first_clause!r}"),
            _row("  thinker decode per token", per_tok, "batch 1"),
            _row("thinker first token (turn 2, prefix reuse)", turn2_reuse,
                 f"cached {int(np.median(cached)) if cached else 0} tokens of the conversation"),
            _row("thinker first token (turn 2, no prefix reuse)", turn2_full, "re-prefills the whole conversation"),
            _row("thinker first token, idle-immediate admission", idle_imm, "lone request, no prefix reuse"),
            _row(f"thinker first token, {WINDOW_MS:.0f} ms batching window", windowed,
                 "the window starts with the lone request"),
        ]
        return rows, first_clause or answer
    finally:
        th.stop()


# ------------------------------------------------------------------------------------------------- talker, vocoder
def measure_talker_vocoder(clause: str, voc_args: dict[str, Any], repeats: int, tts: Any) -> list[dict[str, Any]]:
    from omni_rt.pipeline.schedulers.streaming import StreamState
    from omni_rt.stages.vocoder import create_pcm_vocoder

    tts.synthesize(clause)  # warm
    synth, audio = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        audio = tts.synthesize(clause)
        synth.append((time.perf_counter() - t0) * 1000)
    voc = create_pcm_vocoder(**voc_args)
    first_chunk, per_chunk, n_chunks = [], [], 0
    for r in range(repeats + 1):
        stamps: list[float] = []
        orig = voc.emit
        voc.emit = lambda *a, **k: (stamps.append(time.perf_counter()), orig(*a, **k))  # type: ignore[method-assign]
        t0 = time.perf_counter()
        voc.on_stream_chunk(f"v{r}", StreamState(), Clause(clause, audio, tts.sample_rate), "talker")
        voc.emit = orig  # type: ignore[method-assign]
        while not voc.outbox.empty():
            voc.outbox.get_nowait()
        if r == 0 or not stamps:
            continue  # warm-up (the resampler's first call)
        n_chunks = len(stamps)
        first_chunk.append((stamps[0] - t0) * 1000)
        per_chunk.append((stamps[-1] - t0) * 1000 / len(stamps))
    dur = len(audio) / tts.sample_rate if audio is not None else 0
    return [
        _row("talker first audio (Piper on the first clause)", synth, f"{clause!r} -> {dur:.2f} s of audio"),
        _row("vocoder first chunk (PCM: resample + encode)", first_chunk, f"clause in {n_chunks} chunks of {voc_args.get('chunk_ms', 200)} ms"),
        _row("  vocoder per chunk", per_chunk, ""),
    ]


# ------------------------------------------------------------------------------------------------- main
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--preset", default="cpu", help="the preset whose stage args are used (cpu)")
    p.add_argument("--out", default=str(OUT))


def command(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from omni_rt.presets import load_preset
    from omni_rt.audio.pcm import resample
    from omni_rt.backends.tts_piper import PiperTTS

    cfg = load_preset(args.preset)
    machine = report.machine_info()
    t_start = time.perf_counter()
    tts = PiperTTS()
    speech = tts.synthesize(UTTERANCE).astype(np.float32)
    audio16 = resample(speech, tts.sample_rate, 16000)
    utt_s = len(audio16) / 16000
    _log(f"utterance {utt_s:.2f} s: {UTTERANCE!r}; ASR")
    rows, transcript = measure_asr(dict(cfg.stage("asr").args), audio16, args.repeats)
    _log(f"transcript {transcript!r}; thinker")
    th_rows, first_clause = measure_thinker(dict(cfg.stage("thinker").args), transcript or UTTERANCE, args.repeats)
    rows += th_rows
    _log(f"first clause {first_clause!r}; talker + vocoder")
    rows += measure_talker_vocoder(first_clause, dict(cfg.stage("vocoder").args), args.repeats, tts)

    by = {r["stage"]: r for r in rows}
    def p50(name: str) -> float:
        return by[name]["p50"] or 0.0
    tail = p50("thinker first clause (turn 1)") + p50("talker first audio (Piper on the first clause)") + \
        p50("vocoder first chunk (PCM: resample + encode)")
    est = {"critical_path_speculative_ms": round(p50("ASR final after speech_stopped (decode started in the silence)") + tail, 1),
           "critical_path_no_speculative_ms": round(p50("ASR final after speech_stopped (decode after the turn)") + tail, 1),
           "critical_path_turn2_prefix_reuse_ms": round(
               p50("ASR final after speech_stopped (decode started in the silence)") + tail
               - p50("thinker first token (turn 1)") + p50("thinker first token (turn 2, prefix reuse)"), 1)}
    machine["loadavg_end"] = report.loadavg()
    result = {"started_at": time.strftime("%Y-%m-%d %H:%M"), "machine": machine, "preset": args.preset,
              "utterance": UTTERANCE, "utterance_s": round(utt_s, 2), "transcript": transcript, "first_clause": first_clause,
              "repeats": args.repeats, "stages": rows, "estimate": est, "wall_s": round(time.perf_counter() - t_start, 1)}
    out = Path(args.out)
    report.write_json(result, out)
    print(f"Per-stage latency, preset {args.preset}, in-process ({result['started_at']})")
    print(f"machine: {report.machine_line(machine)}")
    print(f"utterance: {utt_s:.2f} s {UTTERANCE!r} -> {transcript!r}\n")
    print(report.stages_table(rows))
    print(f"\nend-of-turn critical path (p50 sums: ASR final + thinker first clause + talker + vocoder first chunk): "
          f"{est['critical_path_speculative_ms']:.0f} ms with speculative ASR, {est['critical_path_no_speculative_ms']:.0f} ms "
          f"without; turn 2 with prefix reuse {est['critical_path_turn2_prefix_reuse_ms']:.0f} ms")
    print(f"wrote {out} in {result['wall_s']:.0f} s")
    return 0
