"""Does Whisper's encoder hear a listener's response? A linear probe, fitted and scored on the backchannel sets.

The question behind it: Whisper tiny.en's *text* of a 200-600 ms look misreads hums and coughs with confidence
("Amen." for "Mm, right.", "Bye." for a cough); does the encoder output each look computes anyway tell a
listener's sound from other words? A logistic regression over it (``pooled``: the mean, the maximum and the last
200 ms of the speech's frames) is fitted on a corpus written for it, none of the bench's texts: ~50 listener
responses and ~60 interruptions spoken by the CPU preset's Piper voice in six settings (length, VITS noise,
seed) and three pitches (resampled playback, 0.92x / 1x / 1.08x), plus 150 synthetic coughs of another seed.
Interruptions led by a listener word ("Okay, wait.") are left out: their first 300 ms *are* a listener's sound.
Each clip is cut at look lengths (250-900 ms of speech after 400 ms of silence, as the stage's looks hear it)
and encoded by Whisper tiny.en int8 in the quick look's window.

A threshold is read off the training corpus, out of fold (the probe refitted five times, each time without a
fifth of the texts): the lowest 2% of the left-out interruptions' logits at looks of up to 450 ms, rounded down
to half a unit (in-fold logits are overconfident). Reported per bench set (never fitted on): AUC of backchannels
vs interruptions not led by a listener word, and how many looks of each class fall under the threshold. Writes
``latency_bench/results/listener_probe.json``; the finding (tried in the stage, not adopted) is in
docs/benchmarks/turn-taking.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from latency_bench import backchannel_bench as bench

SR = 16000
PRE_MS = 400
CUTS_MS = (250, 350, 450, 550, 700, 900)
OUT = Path(__file__).parent / "results" / "listener_probe.json"
TRAIN_BACKCHANNELS = (
    "Mhm.", "Mm.", "Uh-huh, okay.", "Yeah, sure.", "Okay, yeah.", "Right, okay.", "Sure thing.", "Oh, okay, yeah.",
    "Yes, right.", "I see, okay.", "Oh wow.", "Wow, okay.", "Great.", "Perfect.", "Totally.", "Definitely.", "Indeed.",
    "Yup.", "Ah, right.", "Ah, yes.", "Oh, yes.", "Oh, good.", "Good.", "Uh-huh, uh-huh.", "Yeah, yeah, yeah.",
    "Okay, great.", "Right, sure.", "Got it, thanks.", "Thank you.", "All right.", "I agree.", "Really?", "Oh, cool.",
    "Nice, okay.", "Hmm, okay.", "Hm.", "Mm, okay.", "Mmm, right.", "Ha ha.", "Ha ha ha.", "Oh, I know.", "Sure, okay.",
    "Exactly, yeah.", "Yes, exactly.", "Uh, yeah.", "Um, okay.", "Mmhmm.", "Hmm, yeah.", "Right, yeah.", "Okay, thanks.")
TRAIN_INTERRUPTIONS = (
    "Wait a second.", "Stop there.", "No, that's not it.", "Can you say that again?", "What do you mean?",
    "Hold on, please.", "Sorry, what?", "Excuse me, one thing.", "Actually, never mind.", "Let me ask you something.",
    "How old is he?", "Where is that?", "Tell me a joke.", "Skip that part.", "That's not what I asked.",
    "I don't understand.", "Go on to the next one.", "Change the topic.", "Slow down.", "Speak up, please.",
    "What's the weather like?", "Is it raining?", "Who won the game?", "Can you help me with something else?",
    "Nope, wrong.", "Quiet.", "Halt.", "Be quiet.", "Just a moment.", "Give me a minute.", "Not now.", "Cancel that.",
    "Forget it.", "Start over.", "Say it again.", "Hey, listen.", "Why not?", "When?", "Where?", "Who said that?",
    "Please wait.", "Shh.", "That is incorrect.", "I have another question.", "Let me think.", "Tell me about London.",
    "Can we talk about dogs?", "What time does it open?", "Which one?", "How far is it?", "Do you know Paris?",
    "Make it shorter.", "Is that true?", "Are you sure about that?", "Repeat the last part.", "Go faster.",
    "Explain that.", "What's that?", "Help.", "Dinner is ready.")
# (length_scale, noise_scale, noise_w_scale, seed, playback rate): none of the bench's three settings
VOICES = ((1.0, 0.333, 0.5, 101, 0.92), (0.8, 0.667, 0.8, 102, 1.0), (0.9, 1.0, 1.0, 103, 1.08),
          (1.1, 0.5, 0.8, 104, 0.92), (1.3, 0.667, 0.6, 105, 1.0), (1.15, 0.9, 1.0, 106, 1.08))
COUGH_SEED, N_COUGHS = 1234, 150
# the training interruptions' lowest 2% of out-of-fold logits at cuts up to this length set the threshold
THRESHOLD_CUT_MS, THRESHOLD_QUANTILE = 450, 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--l2", type=float, default=0.1, help="L2 penalty of the logistic regression (default 0.1)")
    p.add_argument("--features", type=Path, default=None,
                   help="cache of the encoded looks (.npz): read if it exists, else written (saves ~10 min on a rerun)")
    p.add_argument("--out", type=Path, default=OUT)


def pooled(encoder_frames: np.ndarray, audio: np.ndarray) -> np.ndarray:
    """The probe's features: the encoder frames (one per 20 ms) over the speech in ``audio``, as their mean,
    their maximum and the mean of the last 10 (the word being said at the look's end)."""
    start = bench.loud_onset(audio) // 320
    end = max(start + 1, min(encoder_frames.shape[0], -(-audio.size // 320)))
    span = np.asarray(encoder_frames[start:end], dtype=np.float32)
    return np.concatenate([span.mean(0), span.max(0), span[-10:].mean(0)])


def led_by_listener_word(text: str) -> bool:
    from omni_rt.stages.asr.interruption import is_backchannel_word, words_of

    words = words_of(text)
    return bool(words) and is_backchannel_word(words[0])


def training_clips() -> list[dict[str, Any]]:
    from omni_rt.audio.pcm import resample
    from omni_rt.backends.tts_piper import PiperTTS

    bench_texts = {t for bcs, ints, _ in bench.HALVES.values() for t in bcs + ints}
    overlap = bench_texts & set(TRAIN_BACKCHANNELS + TRAIN_INTERRUPTIONS)
    if overlap:
        raise SystemExit(f"training texts also in the bench: {sorted(overlap)}")
    out = []
    for ls, ns, nw, seed, rate in VOICES:
        tts = PiperTTS(length_scale=ls, noise_scale=ns, noise_w_scale=nw, seed=seed)
        for kind, texts in (("backchannel", TRAIN_BACKCHANNELS), ("interruption", TRAIN_INTERRUPTIONS)):
            for text in texts:
                if kind == "interruption" and led_by_listener_word(text):
                    continue
                audio = resample(tts.synthesize(text), tts.sample_rate, SR)
                if rate != 1.0:  # played faster or slower: pitch and tempo move together
                    audio = resample(audio, int(SR * rate), SR)
                out.append({"half": "train", "kind": kind, "text": text, "voice": f"{ls}/{ns}/{rate}",
                            "audio": audio.astype(np.float32)})
    rng = np.random.default_rng(COUGH_SEED)
    out += [{"half": "train", "kind": "cough", "text": f"cough {i}", "voice": "-", "audio": bench.cough(rng)}
            for i in range(N_COUGHS)]
    return out


def look_features(asr: Any, clip: dict[str, Any]) -> list[tuple[int, np.ndarray]]:
    """(cut, pooled encoder features) for each look length the clip's speech lasts (a cough: every cut)."""
    from faster_whisper.audio import pad_or_trim

    audio = clip["audio"]
    speech = audio[bench.loud_onset(audio):]
    padded = np.concatenate([np.zeros(PRE_MS * SR // 1000, np.float32), speech])
    out = []
    for cut in CUTS_MS:
        n = (PRE_MS + cut) * SR // 1000
        if clip["kind"] != "cough" and n > padded.size + SR // 5:
            break
        piece = np.pad(padded[:n], (0, max(0, n - padded.size)))
        raw = asr._features(piece)
        window = int(min(3000, max(asr.brief_window_s * 100, raw.shape[-1] + 100)))
        enc = np.asarray(asr.model.encode(np.stack([pad_or_trim(raw, window)]).astype(np.float32)))[0]
        out.append((cut, pooled(enc, piece)))
    return out


def fit(x: np.ndarray, y: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression (LBFGS, float64) on standardised features."""
    import torch

    xt, yt = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> Any:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(xt @ w + b, yt) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().numpy(), float(b.detach()[0])


def auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    pos, neg = scores[labels == 1], scores[labels == 0]
    if not pos.size or not neg.size:
        return None
    return round(float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()), 4)


def _encode_looks(asr: Any, t0: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, clips in (("train", training_clips()), ("bench", bench.clips(24, bench.HALF_CHOICES["all"]))):
        for i, clip in enumerate(clips):
            for cut, f in look_features(asr, clip):
                rows.append({"half": clip["half"], "kind": clip["kind"], "text": clip["text"], "voice": clip["voice"],
                             "cut": cut, "led": clip["kind"] == "interruption" and led_by_listener_word(clip["text"]),
                             "f": f})
            if i % 100 == 0:
                print(f"{name}: {i}/{len(clips)} clips, {time.time() - t0:.0f} s", flush=True)
    return rows


def out_of_fold(train: list[dict[str, Any]], l2: float, folds: int = 5) -> np.ndarray:
    """Every training look's logit from a probe fitted without its text (five folds by text; coughs by index)."""
    keys = sorted({r["text"] for r in train})
    fold = {k: i % folds for i, k in enumerate(keys)}
    x = np.stack([r["f"] for r in train]).astype(np.float64)
    y = np.array([r["kind"] == "interruption" for r in train], dtype=np.float64)
    groups = np.array([fold[r["text"]] for r in train])
    out = np.zeros(len(train))
    for k in range(folds):
        fit_on, held = groups != k, groups == k
        mean, scale = x[fit_on].mean(0), x[fit_on].std(0) + 1e-6
        w, b = fit((x[fit_on] - mean) / scale, y[fit_on], l2)
        out[held] = ((x[held] - mean) / scale) @ w + b
    return out


def _last_looks_under(train: list[dict[str, Any]], logits: np.ndarray, threshold: float) -> dict[str, str]:
    """Per class, how many clips' longest look (the whole of a short response) scores under ``threshold``."""
    last: dict[tuple[str, str, str], int] = {}
    for i, r in enumerate(train):
        key = (r["kind"], r["text"], r["voice"])
        if key not in last or r["cut"] > train[last[key]]["cut"]:
            last[key] = i
    return {kind: f"{sum(logits[i] < threshold for k, i in last.items() if k[0] == kind)}/"
                  f"{sum(k[0] == kind for k in last)}" for kind in ("backchannel", "cough", "interruption")}


def command(args: argparse.Namespace) -> None:
    from omni_rt.backends.whisper import FasterWhisperASR

    t0 = time.time()
    asr = FasterWhisperASR(cpu_threads=2)
    if args.features is not None and args.features.is_file():
        with np.load(args.features) as z:
            rows = [m | {"f": f} for m, f in zip(json.loads(str(z["meta"])), z["f"])]
    else:
        rows = _encode_looks(asr, t0)
        if args.features is not None:
            np.savez_compressed(args.features, f=np.stack([r["f"] for r in rows]),
                                meta=json.dumps([{k: v for k, v in r.items() if k != "f"} for r in rows]))
    train = [r for r in rows if r["half"] == "train"]
    x = np.stack([r["f"] for r in train]).astype(np.float64)
    mean, scale = x.mean(0), x.std(0) + 1e-6
    y = np.array([r["kind"] == "interruption" for r in train], dtype=np.float64)
    w, b = fit((x - mean) / scale, y, args.l2)
    for r in rows:
        r["score"] = float((((r["f"] - mean) / scale) @ w) + b)
    oof = out_of_fold(train, args.l2)
    early = np.array([v for v, r in zip(oof, train) if r["kind"] == "interruption" and r["cut"] <= THRESHOLD_CUT_MS])
    threshold = float(np.floor(np.percentile(early, THRESHOLD_QUANTILE) * 2) / 2)
    last_under = _last_looks_under(train, oof, threshold)
    print(f"out of fold: early interruption looks p1/p2/p5 {np.round(np.percentile(early, [1, 2, 5]), 2)}; "
          f"clips whose longest look is under {threshold}: {last_under}")
    report: dict[str, Any] = {}
    for half in ("train", *bench.HALF_CHOICES["all"]):
        rs = [r for r in rows if r["half"] == half and not r["led"]]
        bc_int = [r for r in rs if r["kind"] != "cough"]
        s = np.array([r["score"] for r in bc_int])
        lab = np.array([r["kind"] == "interruption" for r in bc_int], dtype=np.int64)
        under = {k: f"{sum(r['score'] < threshold for r in rs if r['kind'] == k)}/{sum(r['kind'] == k for r in rs)}"
                 for k in ("backchannel", "cough", "interruption")}
        led = [r for r in rows if r["half"] == half and r["led"]]
        under["interruption led by a listener word"] = f"{sum(r['score'] < threshold for r in led)}/{len(led)}"
        report[half] = {"auc_backchannel_vs_interruption": auc(s, lab), "looks_under_threshold": under}
        print(f"{half:9} AUC {report[half]['auc_backchannel_vs_interruption']}  looks under {threshold}: {under}")
    worst = sorted((r for r in rows if r["half"] != "train" and r["kind"] == "interruption" and not r["led"]),
                   key=lambda r: r["score"])[:10]
    out = {"when": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0)), "seconds": round(time.time() - t0),
           "asr": "faster-whisper tiny.en int8, quick-look window", "l2": args.l2, "threshold_logit": threshold,
           "train_looks": len(train), "cuts_ms": CUTS_MS,
           "out_of_fold": {"early_interruption_logit_p1_p2_p5": [round(float(v), 2) for v in np.percentile(early, [1, 2, 5])],
                           "clips_whose_longest_look_is_under_threshold": last_under},
           "sets": report,
           "lowest_bench_interruptions": [{k: r[k] for k in ("half", "text", "voice", "cut", "score")} for r in worst]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"threshold {threshold}; {time.time() - t0:.0f} s")
