"""What the conversation guards cost the thinker, counted rather than timed (``python -m latency_bench.guard_cost``).

A wall-clock A/B of first audio needs a quiet machine; these counts do not. The same scripted turns go to the
CPU preset's llama.cpp thinker (greedy: the same answers every run on the same code), each turn preceded by the
prefill hint a session sends after an answer (the conversation plus an empty user turn), and per answer this
records:

* ``upstream_requests``: requests sent to llama-server (a retry or a fork is one more);
* ``timings``: llama-server's own ``prompt_n`` (prompt tokens it evaluated: what its prefix cache did not hold)
  and ``cache_n`` (reused), per request;
* ``chunks``: tokens generated (llama-server streams one a chunk), over every request of the answer;
* ``first_passed_at_chunk``: the upstream token with which the answer's first text left the thinker for the
  talker (the answer policy alone releases a word when the next one starts: 2 for most answers; more is what a
  guard held back);
* ``llama_cpu_s``: llama-server's CPU seconds (utime + stime) over the answer (10 ms ticks);
* ``sampler``: the sampling fields of the request body.

Turns: the twelve-turn conversation of issue #50, a six-turn one that asks the same questions twice, and three
two-turn sessions of the latency report's questions (``latency_bench.corpus``). Run it from the root of the tree
to measure (it imports that tree's ``omni_rt``); JSON to ``--out``, a summary per conversation group on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import aclosing
from typing import Any

SYSTEM = "You are a helpful voice assistant. Answer in one or two short spoken sentences, without lists or markup."
CONVERSATIONS: list[tuple[str, list[str]]] = [
    ("issue", ["Hi! My name is Ana and I live in Lisbon.", "What is the capital of France?",
               "How many legs does a spider have?", "What is the opposite of hot?", "How do I boil an egg?",
               "What color is the sky on a clear day?", "Can you recommend a good book?", "How many days are in a week?",
               "What do bees make?", "Give me a tip for sleeping better.", "What is my name?", "Which city do I live in?"]),
    ("repeats", ["Hello, I'm Tom. I work as a nurse in Chicago.", "What is the opposite of loud?",
                 "What is the opposite of loud?", "What is two plus two?", "What is two plus two?", "What is my job?"]),
    ("report0", ["What is the capital of France?", "How many legs does a spider have?"]),
    ("report1", ["Why is the sky blue?", "Who wrote Romeo and Juliet?"]),
    ("report2", ["Which planet is closest to the sun?", "How do plants make their food?"]),
]
HINT_WAIT_S = 1.5  # the user "speaks" while the hint prefills


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _instrument(s: Any, rec: dict[str, dict[str, Any]]) -> None:
    """Wrap the scheduler's generate / emit / request to count per answer (the scheduler itself is unchanged)."""
    generate, emit, request = s.generate, s.emit, s.request

    def counted_generate(rid: str, req: Any):
        r = rec.setdefault(rid, {"upstream_requests": 0, "chunks": 0, "first_passed_at_chunk": None, "timings": []})
        r["upstream_requests"] += 1
        r["timings"].append(None)

        async def gen():
            async with aclosing(generate(rid, req)) as inner:  # closing it frees the request's slot at once
                async for d in inner:
                    if d.timings and r["timings"][-1] is None:
                        r["timings"][-1] = {k: d.timings.get(k) for k in ("prompt_n", "cache_n")}
                    r["chunks"] += bool(d.text)
                    yield d
        return gen()

    def counted_emit(rid: str, kind: str, data: Any = None, **kw: Any) -> Any:
        r = rec.get(rid)
        if r is not None and kind == "stream" and getattr(data, "text", "") and r["first_passed_at_chunk"] is None:
            r["first_passed_at_chunk"] = r["chunks"]
        return emit(rid, kind, data, **kw)

    def counted_request(req: Any, request_id: str | None = None) -> Any:
        path, body = request(req, request_id)
        r = rec.get(request_id or "")
        if r is not None:
            r["sampler"] = {k: body[k] for k in ("temperature", "repeat_penalty", "repeat_last_n", "dry_multiplier",
                                                 "frequency_penalty", "presence_penalty", "seed") if k in body}
        return path, body

    s.generate, s.emit, s.request = counted_generate, counted_emit, counted_request


def run() -> dict[str, Any]:
    sys.path.insert(0, os.getcwd())
    from omni_rt.engine.factory import create_ar_scheduler
    from omni_rt.pipeline.messages import IncomingMessage
    from omni_rt.testing.stage_driver import collect, send

    # the CPU preset's thinker (models/cpu.yaml)
    s = create_ar_scheduler("smollm2", backend="llama.cpp", gguf_format="q8_0", max_batch_size=8, kv_budget_tokens=8192,
                            cpu_threads=1, short_priority_tokens=6, default_max_tokens=96, cache_reuse_tokens=16,
                            sampling={"repetition_penalty": 1.2, "no_repeat_ngram_size": 4}, languages=["en"],
                            answer_policy={"max_sentences": 2, "max_words": 35}, conversation_tokens=256)
    s.start()
    rec: dict[str, dict[str, Any]] = {}
    _instrument(s, rec)
    rows = []
    try:
        pid = s.server.proc.pid
        for sid, turns in CONVERSATIONS:
            msgs: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
            for i, question in enumerate(turns):
                s.inbox.put(IncomingMessage(sid, "prefill_hint", {"messages": msgs + [{"role": "user", "content": ""}],
                                                                   "session_id": sid, "max_tokens": 96}))
                time.sleep(HINT_WAIT_S)
                msgs = msgs + [{"role": "user", "content": question}]
                rid, c0 = f"{sid}-{i}", _cpu_s(pid)
                send(s, rid, {"messages": msgs, "session_id": sid, "max_tokens": 96})
                got = collect(s, [rid], timeout=300)[rid]
                time.sleep(0.3)  # the cancelled request's last step
                res = got["result"] or {}
                rows.append({"rid": rid, "question": question, "answer": res.get("text", ""),
                             "llama_cpu_s": round(_cpu_s(pid) - c0, 3), **rec.get(rid, {})})
                msgs = msgs + [{"role": "assistant", "content": rows[-1]["answer"]}]
        state = s.cache_state()
    finally:
        s.stop()
    return {"rows": rows, "prefill_hints": state.get("prefill_hints"), "copy_forks": state.get("copy_forks")}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = [r["first_passed_at_chunk"] or 0 for r in rows]
    return {"answers": len(rows), "upstream_requests": sum(r["upstream_requests"] for r in rows),
            "prompt_tokens_evaluated": sum((t or {}).get("prompt_n") or 0 for r in rows for t in r["timings"]),
            "tokens_generated": sum(r["chunks"] for r in rows),
            "first_text_at_token_max": max(first, default=0),
            "tokens_held_beyond_2": sum(max(0, f - 2) for f in first),
            "llama_cpu_s": round(sum(r["llama_cpu_s"] for r in rows), 2)}


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m latency_bench.guard_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="guard_cost.json", help="JSON path (default ./guard_cost.json)")
    args = p.parse_args()
    result = run()
    result["summary"] = {"all": summary(result["rows"]),
                         "report questions": summary([r for r in result["rows"] if r["rid"].startswith("report")])}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for name, s in result["summary"].items():
        print(name, json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
