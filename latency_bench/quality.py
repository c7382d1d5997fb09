"""Answer-quality benchmark: are the answers worth hearing? (``python -m latency_bench quality``; not a test.)

A fixed set of everyday questions (facts, how-to, chit-chat, follow-ups that need the previous turn, requests
to stop or repeat), spoken by Piper in real time over ``/v1/realtime`` with ``server_vad``, plus a few typed
questions in other languages (sent as text items: an English Piper voice cannot speak them as input either).
Two servers are started one after the other from the same base preset: ``preset`` (its decoding defaults,
answer policy and language steering as they are) and ``greedy`` (the same preset with ``sampling``,
``answer_policy`` and ``languages`` removed from the thinker args: plain greedy, as before). Per answer:

* words, sentences, seconds of audio, the largest repeated n-gram (and the most repeats of any 4-gram);
* language — a cheap detector (``omni_rt.engine.prompt.language.guess_language``: the script of the letters, then
  for Latin script which language's common function words dominate); it is a heuristic, not a model;
* key word present (factual questions carry the words a right answer must contain);
* word accuracy of an independent faster-whisper tiny.en (loaded here, separately from the server's) on the
  answer's audio against the transcript the server says it spoke: 1 - WER after lower-casing and
  stripping punctuation, with numbers compared as spoken ("100" == "one hundred" is not attempted: such
  words count as errors, which only lowers the figure).

Prints a table and writes ``latency_bench/results/quality.{json,md}``; ``--update-docs`` puts the table in
docs/benchmarks/quality.md between its ``quality:begin``/``quality:end`` markers. ``--limit N`` runs the first N questions (a shorter run, say so).
``--thinker MODEL`` measures another thinker on the same preset (``--no-greedy``: its preset run only).

Over 400 lines on purpose: the question set, the per-answer measures and the run share one answer record;
split the measures out when they grow.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import datetime as _dt
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from latency_bench.ablations import dump_preset
from latency_bench.corpus import SR, Utterance, synthesize_corpus
from latency_bench.server_proc import ROOT, Server, bench_server
from latency_bench.session_driver import BenchSession, Turn
from latency_bench.sweep import log_line

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Q:
    text: str
    kind: str  # fact | howto | chat | followup | control | foreign
    keys: tuple[str, ...] = ()  # any of these in the answer = right (facts)
    typed: bool = False  # sent as a text item instead of speech


# Each inner list is one session (a conversation: follow-ups see the previous turns).
CONVERSATIONS: list[list[Q]] = [
    [Q("What is the capital of France?", "fact", ("paris",)),
     Q("How many legs does a spider have?", "fact", ("eight", "8")),
     Q("Who wrote Romeo and Juliet?", "fact", ("shakespeare",)),
     Q("What is the largest planet in our solar system?", "fact", ("jupiter",)),
     Q("What is the boiling point of water in Celsius?", "fact", ("100", "hundred"))],
    [Q("Which ocean is the largest?", "fact", ("pacific",)),
     Q("What color is the sky on a clear day?", "fact", ("blue",)),
     Q("How many days are in a week?", "fact", ("seven", "7")),
     Q("What is the capital of Japan?", "fact", ("tokyo",)),
     Q("What gas do plants take in from the air?", "fact", ("carbon dioxide", "co2"))],
    [Q("Who painted the Mona Lisa?", "fact", ("leonardo", "vinci")),
     Q("What is the tallest animal in the world?", "fact", ("giraffe",)),
     Q("How many continents are there?", "fact", ("seven", "7")),
     Q("What do bees make?", "fact", ("honey",)),
     Q("What is the freezing point of water in Celsius?", "fact", ("zero", "0"))],
    [Q("How do I make a cup of tea?", "howto"),
     Q("How can I fall asleep faster?", "howto"),
     Q("How do I boil an egg?", "howto"),
     Q("How do I keep my houseplants alive?", "howto")],
    [Q("Give me a tip for learning a new language.", "howto"),
     Q("How do I remove a coffee stain?", "howto"),
     Q("What is a good way to start running?", "howto"),
     Q("What should I pack for a day at the beach?", "howto")],
    [Q("Hello, how are you today?", "chat"),
     Q("Tell me a fun fact about cats.", "chat"),
     Q("Name three colors of the rainbow.", "fact", ("red", "orange", "yellow", "green", "blue", "indigo", "violet")),
     Q("Can you tell me a joke?", "chat")],
    [Q("I am feeling a bit tired today.", "chat"),
     Q("What should I cook for dinner tonight?", "chat"),
     Q("Recommend a good book to read.", "chat"),
     Q("What is your favorite season?", "chat")],
    [Q("What is the capital of Italy?", "fact", ("rome",)),
     Q("What language do people speak there?", "followup", ("italian",)),
     Q("Who was the first person to walk on the moon?", "fact", ("armstrong",)),
     Q("In what year did that happen?", "followup", ("1969",))],
    [Q("What is the largest animal on Earth?", "fact", ("whale",)),
     Q("What does it eat?", "followup", ("krill", "plankton", "fish", "shrimp")),
     Q("What is the capital of Germany?", "fact", ("berlin",)),
     Q("Is it a big city?", "followup")],
    [Q("Tell me about the history of Rome.", "control"),
     Q("Stop, that is enough. Just tell me one thing.", "control"),
     Q("What is two plus two?", "fact", ("four", "4")),
     Q("Can you say that again?", "control", ("four", "4"))],
    [Q("Quelle est la capitale de la France ?", "foreign", ("paris",), typed=True),
     Q("¿Cuál es la capital de España?", "foreign", ("madrid",), typed=True),
     Q("Wie viele Tage hat eine Woche?", "foreign", ("seven", "7", "sieben"), typed=True)],
]


# ============================================================================ text measures
def words_of(text: str) -> list[str]:
    """Lower-cased words without punctuation (apostrophes kept), the unit of every text measure here."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text.lower().replace("\u2019", "'"))  # "1,889" == "1889"
    return re.findall(r"[a-z0-9\u00c0-\uffff]+(?:'[a-z]+)?", text)


def sentences_of(text: str) -> int:
    parts = [p for p in re.split(r"(?<=[.!?])\s+|\n+", text.strip()) if words_of(p)]
    return len(parts)


def repeats(text: str) -> tuple[int, int]:
    """(longest n such that some n-gram occurs at least twice, most occurrences of any one 4-gram). Bare
    numbers are left out, so "1. Don't lie down. 2. Don't lie down." counts as the loop it is."""
    w = [x for x in words_of(text) if not x.isdigit()]
    longest = 0
    for n in range(1, len(w)):
        grams = collections.Counter(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
        if max(grams.values(), default=0) >= 2:
            longest = n
        else:
            break
    four = collections.Counter(tuple(w[i : i + 4]) for i in range(len(w) - 3))
    return longest, max(four.values(), default=0)


def word_accuracy(ref: str, hyp: str) -> tuple[int, int]:
    """(reference words, word edits) — Levenshtein over words; hand-written (a dozen lines) to spare a
    dependency such as jiwer for one metric."""
    r, h = words_of(ref), words_of(hyp)
    prev = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        cur = [i] + [0] * len(h)
        for j, hw in enumerate(h, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (rw != hw))
        prev = cur
    return len(r), prev[-1]


# ============================================================================ client
class QualitySession(BenchSession):
    """A bench session that also keeps each answer's audio, and can ask a typed question."""

    def __init__(self, url: str, idx: int) -> None:
        super().__init__(url, idx, chunk_ms=20, transcription=True)
        self.audio: dict[str, list[bytes]] = collections.defaultdict(list)

    def _on_event(self, ev: dict[str, Any], t: float) -> None:
        if ev.get("type") == "response.output_audio.delta":
            self.audio[ev.get("response_id", "")].append(base64.b64decode(ev["delta"]))
        super()._on_event(ev, t)

    async def ask_typed(self, text: str, timeout: float) -> Turn:
        turn = self._new_turn("ask", Utterance(text, b"", 0))
        turn.t_speech_stopped = time.perf_counter()  # TTFA of a typed turn: from response.create
        await self.ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
        await self.ws.send(json.dumps({"type": "response.create"}))
        await self._wait(turn, timeout)
        return turn


async def run_conversations(url: str, convs: list[list[Q]], corpus: dict[str, Utterance],
                            timeout: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ci, conv in enumerate(convs):
        s = QualitySession(url, ci)
        await s.open()
        try:
            for q in conv:
                turn = await (s.ask_typed(q.text, timeout) if q.typed else s.ask(corpus[q.text], timeout))
                r = turn.resp
                pcm = b"".join(s.audio.get(r.id, [])) if r is not None else b""
                ttfa = None
                if r is not None and r.t_first_audio is not None and turn.t_speech_stopped is not None:
                    ttfa = (r.t_first_audio - turn.t_speech_stopped) * 1000.0
                out.append({"q": q, "conv": ci, "heard": turn.transcript, "text": r.text if r else "",
                            "status": r.status if r else None, "failure": turn.failure, "ttfa_ms": ttfa,
                            "pcm": pcm})
                log_line(f"  [{ci}] {q.text!r} -> {(r.text if r else '')[:90]!r}")
                await asyncio.sleep(1.0)  # a pause between turns, as a person would leave
        finally:
            await s.close()
    return out


# ============================================================================ scoring
def rescore_text(a: dict[str, Any], keys: tuple[str, ...]) -> None:
    """(Re)compute the text measures of one scored answer in place (``--rescore`` uses it on a saved run)."""
    from omni_rt.engine.prompt.language import guess_language

    text = a["answer"]
    a["words"], a["sentences"] = len(words_of(text)), sentences_of(text)
    a["longest_repeat_ngram"], a["max_4gram_repeats"] = repeats(text)
    a["language"] = guess_language(text) or "none"
    low = " ".join(words_of(text))
    a["key_word"] = any(k in low for k in keys) if keys else None
    a["ref_words"], a["word_edits"] = word_accuracy(text, a["whisper_heard"])


def score(rows: list[dict[str, Any]], whisper: Any) -> list[dict[str, Any]]:
    from omni_rt.audio.pcm import pcm16_to_float, resample
    from omni_rt.engine.prompt.language import guess_language

    out = []
    for row in rows:
        q: Q = row["q"]
        text = row["text"]
        audio = pcm16_to_float(row["pcm"]) if row["pcm"] else np.zeros(0, np.float32)
        heard = ""
        if audio.size:
            segs, _ = whisper.transcribe(resample(audio, SR, 16000), language="en", beam_size=1,
                                         condition_on_previous_text=False)
            heard = " ".join(s.text for s in segs)
        nref, edits = word_accuracy(text, heard)
        longest, rep4 = repeats(text)
        low = " ".join(words_of(text))
        out.append({
            "question": q.text, "kind": q.kind, "typed": q.typed, "conv": row["conv"], "asr_heard": row["heard"],
            "answer": text, "status": row["status"], "failure": row["failure"],
            "words": len(words_of(text)), "sentences": sentences_of(text), "audio_s": round(audio.size / SR, 2),
            "longest_repeat_ngram": longest, "max_4gram_repeats": rep4,
            "language": guess_language(text) or "none",
            "key_word": (any(k in low for k in q.keys) if q.keys else None),
            "whisper_heard": heard.strip(), "ref_words": nref, "word_edits": edits,
            "ttfa_ms": None if row["ttfa_ms"] is None else round(row["ttfa_ms"], 1),
        })
    return out


def pct(xs: list[float], p: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(answers: list[dict[str, Any]]) -> dict[str, Any]:
    facts = [a for a in answers if a["key_word"] is not None and a["kind"] in ("fact", "followup", "foreign")]
    refs = sum(a["ref_words"] for a in answers)
    spoken = [a for a in answers if not a["typed"]]
    return {
        "answers": len(answers),
        "failed": sum(1 for a in answers if a["status"] != "completed"),
        "loops_4gram_3x": sum(1 for a in answers if a["max_4gram_repeats"] >= 3),
        "not_english": sum(1 for a in answers if a["language"] not in ("en", "none")),
        "words_p50": pct([a["words"] for a in answers], 50), "words_p95": pct([a["words"] for a in answers], 95),
        "audio_s_p50": pct([a["audio_s"] for a in answers], 50), "audio_s_p95": pct([a["audio_s"] for a in answers], 95),
        "sentences_p50": pct([a["sentences"] for a in answers], 50),
        "key_word_rate": (sum(bool(a["key_word"]) for a in facts) / len(facts)) if facts else None,
        "key_word_n": len(facts),
        "word_accuracy": (1.0 - sum(a["word_edits"] for a in answers) / refs) if refs else None,
        "ttfa_p50_ms": pct([a["ttfa_ms"] for a in spoken], 50),
        "ttfa_p95_ms": pct([a["ttfa_ms"] for a in spoken], 95),
    }


TARGETS = [
    ("loops_4gram_3x", "answers with a 4-gram repeated 3+ times", lambda v: v == 0, "= 0"),
    ("not_english", "answers in a language the voice cannot speak", lambda v: v == 0, "= 0"),
    ("words_p95", "answer length p95 (words)", lambda v: v is not None and v <= 40, "<= 40"),
    ("audio_s_p95", "answer audio p95 (s)", lambda v: v is not None and v <= 15, "<= 15"),
    ("key_word_rate", "key word present (factual)", lambda v: v is not None and v >= 0.8, ">= 80%"),
    ("word_accuracy", "independent Whisper hears the spoken words", lambda v: v is not None and v >= 0.95, ">= 95%"),
]


def fmt(v: Any, key: str) -> str:
    if v is None:
        return "-"
    if key in ("key_word_rate", "word_accuracy"):
        return f"{100 * v:.0f}%"
    if isinstance(v, float):
        return f"{v:.1f}" if v < 100 else f"{v:.0f}"
    return str(v)


def markdown(result: dict[str, Any]) -> str:
    runs = result["runs"]
    names = sorted(runs, key=lambda n: n != "preset")
    head = ["metric"] + [f"{n} ({runs[n]['label']})" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = [("answers", "answers (failed)"), ("words_p50", "words p50"), ("words_p95", "words p95"),
            ("audio_s_p50", "audio s p50"), ("audio_s_p95", "audio s p95"), ("sentences_p50", "sentences p50"),
            ("loops_4gram_3x", "loops (a 4-gram 3+ times)"), ("not_english", "not in English"),
            ("key_word_rate", "key word present (factual)"), ("word_accuracy", "Whisper word accuracy"),
            ("ttfa_p50_ms", "TTFA p50 ms (spoken turns)"), ("ttfa_p95_ms", "TTFA p95 ms")]
    for key, label in rows:
        cells = []
        for n in names:
            s = runs[n]["summary"]
            cells.append(f"{s['answers']} ({s['failed']})" if key == "answers" else fmt(s[key], key))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    s = runs[names[0]]["summary"]
    checks = [f"- [{'PASS' if ok(s[k]) else 'FAIL'}] {label}: {fmt(s[k], k)} (goal {goal})"
              for k, label, ok, goal in TARGETS]
    return "\n".join(lines) + "\n\n" + "\n".join(checks) + "\n"


def worst(answers: list[dict[str, Any]], n: int = 3) -> list[str]:
    bad = sorted(answers, key=lambda a: (-a["max_4gram_repeats"], -a["words"]))[:n]
    return [f"  {a['words']:3d} w {a['audio_s']:5.1f} s  {a['question']!r} -> {a['answer'][:120]!r}" for a in bad]


# ============================================================================ main
def derive(base: str, greedy: bool, tmp: Path) -> str:
    """The preset file a run serves: the base as is, or its thinker without the decoding/policy/language args."""
    import yaml

    from omni_rt.presets import PRESET_DIR

    path = Path(base) if Path(base).suffix else PRESET_DIR / f"{base}.yaml"
    if not greedy:
        return str(path)
    data = yaml.safe_load(path.read_text())
    entry = next(st for st in data["stages"] if st["name"] == data["entry"])
    for key in ("sampling", "answer_policy", "languages"):
        entry.setdefault("args", {}).pop(key, None)
    data["name"] = f"{data.get('name', 'preset')}-greedy"
    out = tmp / f"{path.stem}-greedy.yaml"
    out.write_text(dump_preset(data, f"{path.name} with plain greedy decoding: no sampling defaults, no answer "
                                        "policy, no language steering (latency_bench.quality)"))
    return str(out)


def plan_servers(args: argparse.Namespace, tmp: Path) -> list[tuple[str, str, str, Server]]:
    """(name, label, preset file, server not yet started) of each run, in order; every server gets ``--thinker``."""
    order = [("preset", False, "its decoding defaults"), ("greedy", True, "plain greedy, before")]
    if getattr(args, "no_greedy", False):
        order = order[:1]
    out = []
    for name, greedy, label in (order[::-1] if args.greedy_first else order):
        preset = derive(args.preset, greedy, tmp)
        out.append((name, label, preset, bench_server(args, preset, name, tmp)))
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from faster_whisper import WhisperModel

    from omni_rt.inventory import thinker_line

    # checked (and named for the report) before anything is synthesized or started
    thinker = thinker_line(args.preset, args.thinker, os.environ.get("OMNI_RT_THINKER_API_KEY"))

    from omni_rt.backends.whisper import default_whisper_dir

    # --limit N keeps the first ceil(N / conversations) turns of every conversation, so a short run still
    # holds every kind of question (and follow-ups still follow their question)
    per = -(-args.limit // len(CONVERSATIONS)) if args.limit else 10**9
    convs = [conv[:per] for conv in CONVERSATIONS]
    texts = [q.text for c in convs for q in c if not q.typed]
    log_line(f"synthesizing {len(texts)} spoken questions with Piper")
    corpus = synthesize_corpus(texts)
    whisper = WhisperModel(str(default_whisper_dir()), device="cpu", compute_type="int8", cpu_threads=1)
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, label, preset, server in plan_servers(args, Path(tmp)):
            server.start()
            log_line(f"server '{name}' ({preset}) up in {server.startup_s} s")
            try:
                rows = await run_conversations(server.ws_url, convs, corpus, args.timeout)
            finally:
                server.stop()
            answers = score(rows, whisper)
            runs[name] = {"label": label, "preset_file": preset if name == "greedy" else args.preset,
                          "summary": summary(answers), "answers": answers}
            partial = Path(args.out).with_suffix(".partial.json")  # a run cut short still leaves its answers
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(runs, indent=1, ensure_ascii=False))
    return {
        "when": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "preset": args.preset, "thinker": thinker,
        "limit": args.limit,
        "questions": sum(len(c) for c in convs), "wall_s": round(time.perf_counter() - t0, 1),
        "load_avg_start": round(load0, 2), "cpus": os.cpu_count(), "runs": runs,
        "detector": "script + function-word heuristic (omni_rt.engine.prompt.language.guess_language)",
    }


DOCS_PAGE = ROOT / "docs" / "benchmarks" / "quality.md"
BEGIN, END = "<!-- quality:begin -->", "<!-- quality:end -->"


def update_docs(md: str, header: str, page: Path = DOCS_PAGE) -> None:
    """Write the generated table into ``page`` between ``BEGIN`` and ``END`` (the page's prose and history stay);
    a page without the markers is an error naming them, not a guess where the table goes."""
    text = page.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start == -1 or end < start:
        raise ValueError(f"{page} has no {BEGIN} ... {END} block for the generated table")
    page.write_text(f"{text[:start]}{BEGIN}\n{header}\n\n{md.rstrip()}\n{text[end:]}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="cpu", help="base preset: cpu | gpu | YAML path (default cpu)")
    p.add_argument("--limit", type=int, default=None,
                   help="about N questions: the first N/conversations turns of every conversation (a shorter run)")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for one answer")
    p.add_argument("--thinker", default=None, metavar="MODEL",
                   help="the servers run this thinker (omni-rt serve --thinker: a .gguf file or http(s)://HOST:PORT/v1); "
                        "the table names it")
    p.add_argument("--no-greedy", action="store_true", help="only the preset's decoding (skip the plain-greedy server)")
    p.add_argument("--greedy-first", action="store_true", help="run the greedy server first (order effects on TTFA)")
    p.add_argument("--out", default=str(RESULTS / "quality.json"))
    p.add_argument("--update-docs", action="store_true",
                   help="write the table into docs/benchmarks/quality.md (between its quality:begin/end markers)")
    p.add_argument("--rescore", default=None, metavar="JSON",
                   help="recompute the text measures and the table of a saved run (no servers, no audio)")


def command(args: argparse.Namespace) -> int:
    """``python -m latency_bench quality`` (a wrong ``--thinker`` raises ``ThinkerError``: the command line prints it)."""
    if args.rescore:
        result = json.loads(Path(args.rescore).read_text())
        keys = {q.text: q.keys for c in CONVERSATIONS for q in c}
        for r in result["runs"].values():
            for a in r["answers"]:
                rescore_text(a, keys.get(a["question"], ()))
            r["summary"] = summary(r["answers"])
    else:
        result = asyncio.run(run(args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    md = markdown(result)
    thinker = result.get("thinker") or "the preset's"  # runs saved before --thinker ran the preset's
    header = (f"`python -m latency_bench quality` ({result['when']}, preset `{result['preset']}`, thinker {thinker}, "
              f"{result['questions']} questions{' (--limit)' if result['limit'] else ''}, {result['cpus']} CPUs, "
              f"load avg {result['load_avg_start']} at start, {result['wall_s']:.0f} s): the preset's decoding "
              f"defaults{' vs plain greedy, same run, same spoken questions' if 'greedy' in result['runs'] else ''}. Language by a script + function-word "
              "heuristic; word accuracy = 1 - WER of an independent faster-whisper tiny.en on the answer audio "
              "vs the server's spoken transcript.")
    out.with_suffix(".md").write_text(header + "\n\n" + md)
    print(header + "\n\n" + md)
    for name, r in result["runs"].items():
        print(f"worst answers, {name}:")
        print("\n".join(worst(r["answers"])))
    if args.update_docs:
        update_docs(md, header)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0
