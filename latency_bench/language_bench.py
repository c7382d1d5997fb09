"""Answers in the voice's language under the instructions clients really send.

Clients bring their own instructions ("You are a helpful voice AI assistant.", "Answer in one short sentence.",
...), and under some of them the CPU preset's 135M thinker opens an answer in French, Italian or Portuguese
("L'Alma: Paris, France" for the capital of France). Each of ``INSTRUCTIONS`` (and none) is sent with each of
``QUESTIONS`` (everyday questions, many naming foreign places) as a typed text turn on its own session of a real
server; an answer is off-language when its first word is another language's article or elision
(``FOREIGN_START``) or a sentence of it reads as another language (``omni_rt.engine.prompt.language.off_language``).
Questions alternate between a tuning half (even) and a held-out half (odd). Results in
``latency_bench/results/language.json``; history in docs/benchmarks/conversations.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import websockets

from latency_bench.report import RESULTS_DIR
from latency_bench.server_proc import Server
from omni_rt.engine.prompt.language import off_language

INSTRUCTIONS = [
    "You are a helpful voice assistant. Answer in one short sentence.",
    "You are a helpful voice AI assistant.",
    "You are a helpful assistant.",
    "You are a friendly assistant on a phone call. Keep your answers brief.",
    "Your knowledge cutoff is 2023-10. You are a helpful, witty, and friendly AI. Act like a human.",
    "Be brief.",
    "",  # none: the preset's own
]
QUESTIONS = [
    "What is the capital of France?", "What is the capital of Italy?", "Where is Lisbon?", "What is the tallest mountain?",
    "Who wrote Don Quixote?", "What language do people speak in Brazil?", "What is the capital of Spain?",
    "How far is Paris from London?", "What is the capital of Germany?", "What food is Naples famous for?",
    "Which river runs through Rome?", "What is Tokyo known for?", "What is the capital of Portugal?", "Tell me about Barcelona.",
    "What is the weather like in Madrid in summer?", "Who painted the Mona Lisa?", "What is the largest city in Mexico?",
    "What can I see in Venice?", "How do I say hello in French?", "What is the capital of Brazil?", "Where is the Eiffel Tower?",
    "What is a croissant?", "Which country has the city of Milan?", "What is the population of Berlin?",
    "How do I make a cup of tea?", "What is two plus two?", "Why is the sky blue?", "What should I cook for dinner?",
    "What is the capital of Canada?", "Recommend a good book.", "What is the opposite of hot?", "How many days are in a week?",
]
FOREIGN_START = re.compile(r"^(L'|D'|Le |La |Les |Il |El |Los |Las |Der |Die |Das |Un |Une |Uno |Una |O |Os |Ao |Au )")


async def ask(url: str, instructions: str, question: str, timeout: float) -> str:
    """One typed question on a fresh text session; the answer's text."""
    async with websockets.connect(f"{url}/v1/realtime?model=omni") as ws:
        session: dict[str, Any] = {"type": "realtime", "output_modalities": ["text"]}
        if instructions:
            session["instructions"] = instructions
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}}))
        await ws.send(json.dumps({"type": "response.create"}))
        async with asyncio.timeout(timeout):
            async for raw in ws:
                event = json.loads(raw)
                if event["type"] == "response.done":
                    return " ".join(c.get("text") or c.get("transcript") or "" for item in event["response"]["output"]
                                    for c in item.get("content", [])).strip()
    return ""


def is_off(answer: str) -> bool:
    return bool(FOREIGN_START.match(answer)) or off_language(answer, ("en",))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = None
    url = args.url
    if url is None:
        server = Server(args.preset, "language", Path(args.log_dir or tempfile.mkdtemp())).start()
        url = server.ws_url
    rows = []
    try:
        for instructions in args.instructions or INSTRUCTIONS:
            for i, question in enumerate(QUESTIONS):
                answer = await ask(url, instructions, question, args.timeout)
                rows.append({"instructions": instructions, "question": question, "half": "tuning" if i % 2 == 0 else "held_out",
                             "answer": answer, "off_language": is_off(answer)})
    finally:
        if server is not None:
            server.stop()
    halves = {h: [r for r in rows if r["half"] == h] for h in ("tuning", "held_out")}
    return {"preset": args.preset, "load_1m_end": round(os.getloadavg()[0], 2),
            "off_language": {h: sum(r["off_language"] for r in rs) for h, rs in halves.items()},
            "answers": {h: len(rs) for h, rs in halves.items()}, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    off, n = result["off_language"], result["answers"]
    lines = ["| half | off-language answers |", "|---|---|"]
    lines += [f"| {h} | {off[h]}/{n[h]} |" for h in ("tuning", "held_out")]
    lines += [f"- {r['question']} ({r['instructions'][:30] or 'no instructions'}): {r['answer'][:70]!r}"
              for r in result["rows"] if r["off_language"]]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="cpu")
    p.add_argument("--url", default=None, help="ws://HOST:PORT of a running server")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one answer")
    p.add_argument("--instructions", action="append", default=None,
                   help="these instructions only (repeatable; '' for none) instead of every one of INSTRUCTIONS")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--out", default=str(RESULTS_DIR / "language.json"))


def command(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(markdown(result))
    return 0
