"""Multi-turn conversation bench: do long conversations hold together? (``python -m latency_bench conversations``)

Single-question benches (``latency_bench.quality``) pass while a real conversation falls apart: a twelve-turn chat
on the CPU preset looped, copied earlier answers word for word, drifted into Portuguese and forgot the user's
name (issue #50). This bench drives scripted text conversations of 12-20 turns over ``/v1/realtime`` (text
output, ``conversation.item.create`` + ``response.create``; a tool turn forces a call, sends its
``function_call_output`` and asks for the spoken follow-up) and counts, per answer:

* **loop** — some word 4-gram occurs three times or more in the answer;
* **repeat** — the answer is word for word an earlier answer of the same conversation (case and punctuation
  ignored; empty answers are not counted as repeats but as ``empty``);
* **off-language** — a sentence of the answer (3+ words) looks written in another language than English
  (``omni_rt.engine.prompt.language.guess_language``: script, then function words: a heuristic);
* **recall** — a turn that asks for a fact the user gave earlier: one of its key words is in the answer;
* **tool use** — the answer after a tool's output holds one of the result's key words.

Prints a table, writes ``latency_bench/results/conversations.json`` (every answer kept) and, with
``--update-docs``, the table into ``docs/benchmarks/conversations.md`` under a heading named by ``--label``
(``baseline``, ``after``: both kept on the page). ``--thinker MODEL`` runs the server with another thinker.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as _dt
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
DOCS = ROOT / "docs" / "benchmarks" / "conversations.md"


@dataclass(frozen=True)
class T:
    """One user turn: ``keys`` (any of them in the answer = right) make it a recall turn (``kind="recall"``) or
    a tool turn (``tool``: (function name, its output as a JSON-able object); keys = words of that output)."""

    text: str
    kind: str = "chat"  # chat | fact | recall | tool | place
    keys: tuple[str, ...] = ()
    tool: tuple[str, Any] | None = None


TOOLS = {
    "get_weather": {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "get_order_status": {"type": "function", "name": "get_order_status", "description": "Status of a customer's order.",
                         "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                                        "required": ["order_id"]}},
    "get_time": {"type": "function", "name": "get_time", "description": "Current local time in a city.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
}

# the conversation of issue #50 first: a name and a city given, ten everyday questions, both asked back
CONVERSATIONS: list[list[T]] = [
    [T("Hi! My name is Ana and I live in Lisbon."),
     T("What is the capital of France?", "fact", ("paris",)),
     T("How many legs does a spider have?", "fact", ("eight", "8")),
     T("What is the opposite of hot?", "fact", ("cold",)),
     T("How do I boil an egg?"),
     T("What color is the sky on a clear day?", "fact", ("blue",)),
     T("Can you recommend a good book?"),
     T("How many days are in a week?", "fact", ("seven", "7")),
     T("What do bees make?", "fact", ("honey",)),
     T("Give me a tip for sleeping better."),
     T("What is my name?", "recall", ("ana",)),
     T("Which city do I live in?", "recall", ("lisbon",))],
    [T("Hello, I'm Tom. I work as a nurse in Chicago."),
     T("What is a good breakfast before a long shift?"),
     T("How much water should I drink in a day?"),
     T("What is the largest planet in our solar system?", "fact", ("jupiter",)),
     T("What is the weather like in Chicago right now?", "tool", ("snow", "minus", "-3", "three"),
       ("get_weather", {"city": "Chicago", "weather": "snowing", "celsius": -3})),
     T("Should I take the bus or walk to work then?"),
     T("Tell me a fun fact about octopuses."),
     T("How do I make a cup of tea?"),
     T("What is the boiling point of water in Celsius?", "fact", ("100", "hundred")),
     T("Which ocean is the largest?", "fact", ("pacific",)),
     T("What is my job?", "recall", ("nurse",)),
     T("What is my name?", "recall", ("tom",)),
     T("Where do I work?", "recall", ("chicago",))],
    [T("My name is Priya and my favourite food is pasta."),
     T("I'm planning a trip to Kraków next month."),
     T("What should I pack for a city trip?"),
     T("How do you say thank you politely?"),
     T("What is the capital of Japan?", "fact", ("tokyo",)),
     T("Is Kraków far from Warsaw?", "place"),
     T("What can I see in Gdańsk?", "place"),
     T("How many continents are there?", "fact", ("seven", "7")),
     T("What is a healthy snack?"),
     T("Who wrote Romeo and Juliet?", "fact", ("shakespeare",)),
     T("What city am I travelling to?", "recall", ("krak",)),
     T("What is my favourite food?", "recall", ("pasta",)),
     T("And what is my name?", "recall", ("priya",))],
    [T("Hi, I'm Lukas from Munich. I have a dog called Max."),
     T("How often should I walk a dog?"),
     T("What do dogs like to eat?"),
     T("What is the tallest animal in the world?", "fact", ("giraffe",)),
     T("Tell me about Zürich.", "place"),
     T("Is São Paulo a big city?", "place"),
     T("What is the freezing point of water in Celsius?", "fact", ("zero", "0")),
     T("How do I keep my houseplants alive?"),
     T("What time is it in Munich?", "tool", ("seven", "7", "19"),
       ("get_time", {"city": "Munich", "time": "7:15 in the evening"})),
     T("Give me an idea for dinner."),
     T("What is my dog's name?", "recall", ("max",)),
     T("Which city am I from?", "recall", ("munich",)),
     T("What is my name?", "recall", ("lukas",))],
    [T("My name is Sofia. Please remember that my order number is 42."),
     T("How do I return a pair of shoes?"),
     T("What is a good way to start running?"),
     T("Can you check the status of my order 42?", "tool", ("shipped", "tomorrow"),
       ("get_order_status", {"order_id": "42", "status": "shipped", "arrives": "tomorrow"})),
     T("Great. What should I cook tonight?"),
     T("How many hours of sleep do adults need?", "fact", ("seven", "eight", "7", "8")),
     T("What gas do plants take in from the air?", "fact", ("carbon dioxide", "co2")),
     T("Tell me something about Reykjavík.", "place"),
     T("What is the capital of Italy?", "fact", ("rome",)),
     T("How do I remove a coffee stain?"),
     T("What is my order number?", "recall", ("42", "forty")),
     T("What is my name?", "recall", ("sofia",))],
    [T("I'm Kenji, I live in Osaka and I love baseball."),
     T("What is a good stretch after sitting all day?"),
     T("Who painted the Mona Lisa?", "fact", ("leonardo", "vinci")),
     T("How many players are on a baseball team?", "fact", ("nine", "9")),
     T("What is Kyōto famous for?", "place"),
     T("What is the weather in Osaka today?", "tool", ("sunny", "24", "twenty"),
       ("get_weather", {"city": "Osaka", "weather": "sunny", "celsius": 24})),
     T("Should I bring an umbrella?"),
     T("How do I make rice?"),
     T("What is the largest desert in the world?"),
     T("Tell me a joke."),
     T("Which sport do I love?", "recall", ("baseball",)),
     T("Which city do I live in?", "recall", ("osaka",)),
     T("What is my name?", "recall", ("kenji",))],
    [T("Hello! My name is Grace and my sister's name is Emma."),
     T("What is a nice gift for a sister's birthday?"),
     T("How do I bake a simple cake?"),
     T("How many sides does a triangle have?", "fact", ("three", "3")),
     T("What is the capital of Spain?", "fact", ("madrid",)),
     T("I went to Málaga last summer.", "place"),
     T("What is the best season to visit Sevilla?", "place"),
     T("What do cows drink?", "fact", ("water",)),
     T("How can I save money on groceries?"),
     T("What is the chemical symbol for gold?", "fact", ("au",)),
     T("How do I stay focused while studying?"),
     T("What is my sister's name?", "recall", ("emma",)),
     T("What is my name?", "recall", ("grace",))],
    [T("Hi, I'm Omar. I'm allergic to peanuts."),
     T("What can I eat for lunch at work?"),
     T("Is peanut butter a good snack for me?"),
     T("How many minutes are in an hour?", "fact", ("sixty", "60")),
     T("What is the speed of light roughly?"),
     T("What time is it in Dubai?", "tool", ("three", "3", "15"),
       ("get_time", {"city": "Dubai", "time": "3 in the afternoon"})),
     T("Tell me about Marrakech.", "place"),
     T("What is the smallest planet?", "fact", ("mercury",)),
     T("How do I clean a cast iron pan?"),
     T("What is a good exercise for the back?"),
     T("Which food am I allergic to?", "recall", ("peanut",)),
     T("What is my name?", "recall", ("omar",))],
    [T("My name is Chloe and I am learning the guitar."),
     T("How long should I practice every day?"),
     T("What is a good first song to learn?"),
     T("How many strings does a guitar have?", "fact", ("six", "6")),
     T("Who was Mozart?", "fact", ("compos", "music")),
     T("I'd love to visit Wien one day.", "place"),
     T("What is the capital of Canada?", "fact", ("ottawa",)),
     T("How do I take care of my fingers?"),
     T("What is the weather in Montréal?", "tool", ("rain", "8", "eight"),
       ("get_weather", {"city": "Montreal", "weather": "light rain", "celsius": 8})),
     T("What should I wear then?"),
     T("What is the opposite of loud?", "fact", ("quiet", "soft")),
     T("Which instrument am I learning?", "recall", ("guitar",)),
     T("What is my name?", "recall", ("chloe",))],
    [T("Hi, I'm Daniel, I'm 34 and I live in Dublin."),
     T("How do I plan a weekend hike?"),
     T("What should I bring on a hike?"),
     T("What is the longest river in the world?", "fact", ("nile", "amazon")),
     T("How many hours are in a day?", "fact", ("24", "twenty")),
     T("Tell me about Göteborg.", "place"),
     T("What is Düsseldorf known for?", "place"),
     T("How do I make a good cup of coffee?"),
     T("What is the capital of Germany?", "fact", ("berlin",)),
     T("How can I learn to cook?"),
     T("What is a good habit for the morning?"),
     T("How old am I?", "recall", ("34", "thirty")),
     T("Which city do I live in?", "recall", ("dublin",)),
     T("What is my name?", "recall", ("daniel",))],
]


# ============================================================================ measures
def words_of(text: str) -> list[str]:
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text.lower().replace("\u2019", "'"))
    return re.findall(r"[a-z0-9\u00c0-\uffff]+(?:'[a-z]+)?", text)


def max_4gram(text: str) -> int:
    """Most occurrences of any one 4-gram of words (bare numbers left out: "1. x y z 2. x y z" is the loop it is)."""
    w = [x for x in words_of(text) if not x.isdigit()]
    grams = collections.Counter(tuple(w[i : i + 4]) for i in range(len(w) - 3))
    return max(grams.values(), default=0)


def off_language(text: str, lang: str = "en") -> bool:
    """Any sentence of 3+ words guessed in another language (or the whole answer, when it has no sentences)."""
    from omni_rt.engine.prompt.language import guess_language

    parts = [p for p in re.split(r"(?<=[.!?])\s+|\n+", text) if len(words_of(p)) >= 3] or [text]
    return any((g := guess_language(p)) is not None and g != lang for p in parts)


def score_conversation(turns: list[T], answers: list[str]) -> list[dict[str, Any]]:
    out, seen = [], set()
    for t, a in zip(turns, answers):
        norm = " ".join(words_of(a))
        low = a.lower()
        row = {"user": t.text, "kind": t.kind, "answer": a, "words": len(words_of(a)), "max_4gram": max_4gram(a),
               "loop": max_4gram(a) >= 3, "repeat": bool(norm) and norm in seen, "empty": not norm,
               "off_language": bool(norm) and off_language(a)}
        if t.keys:
            row["right"] = any(k in low for k in t.keys)
        seen.add(norm) if norm else None
        out.append(row)
    return out


def summary(convs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    rows = [r for c in convs for r in c]

    def share(kind: str) -> list[int]:
        sel = [r for r in rows if r["kind"] == kind]
        return [sum(r["right"] for r in sel), len(sel)]

    return {"conversations": len(convs), "answers": len(rows),
            "loops": sum(r["loop"] for r in rows), "repeats": sum(r["repeat"] for r in rows),
            "off_language": sum(r["off_language"] for r in rows), "empty": sum(r["empty"] for r in rows),
            "recall": share("recall"), "tool_use": share("tool"), "facts": share("fact"),
            "issue_conversation_recall": [sum(r.get("right", False) for r in convs[0] if r["kind"] == "recall"),
                                          sum(r["kind"] == "recall" for r in convs[0])] if convs else [0, 0],
            "words_mean": round(sum(r["words"] for r in rows) / max(1, len(rows)), 1)}


# ============================================================================ client
class Chat:
    """One Realtime session with text output."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def send(self, ev: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(ev))

    async def until(self, etype: str) -> list[dict[str, Any]]:
        seen = []
        while True:
            ev = json.loads(await self.ws.recv())
            seen.append(ev)
            if ev["type"] == "error":
                raise RuntimeError(f"server error: {ev}")
            if ev["type"] == etype:
                return seen

    async def respond(self, response: dict[str, Any] | None = None) -> dict[str, Any]:
        await self.send({"type": "response.create", **({"response": response} if response else {})})
        return (await self.until("response.done"))[-1]["response"]

    async def user(self, text: str) -> None:
        await self.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
        await self.until("conversation.item.done")


def answer_text(resp: dict[str, Any]) -> str:
    parts = []
    for item in resp.get("output") or []:
        for c in item.get("content") or []:
            parts.append(c.get("text") or c.get("transcript") or "")
    return "".join(parts).strip()


async def run_conversation(url: str, turns: list[T], timeout: float, log: bool = True,
                           instructions: str | None = None) -> list[str]:
    """The answers of one scripted conversation on a text session (``instructions``: the client's; None: the
    preset's)."""
    import websockets

    answers = []
    async with websockets.connect(f"{url}/v1/realtime", max_size=None, open_timeout=60) as ws:
        chat = Chat(ws)
        await chat.until("session.created")
        session: dict[str, Any] = {"type": "realtime", "output_modalities": ["text"]}
        if instructions is not None:
            session["instructions"] = instructions
        await chat.send({"type": "session.update", "session": session})
        await chat.until("session.updated")
        for t in turns:
            async with asyncio.timeout(timeout):
                await chat.user(t.text)
                if t.tool is not None:
                    name, result = t.tool
                    resp = await chat.respond({"tools": [TOOLS[name]], "tool_choice": {"type": "function", "name": name}})
                    calls = [o for o in resp["output"] if o["type"] == "function_call"]
                    if calls:
                        await chat.send({"type": "conversation.item.create", "item": {
                            "type": "function_call_output", "call_id": calls[0]["call_id"], "output": json.dumps(result)}})
                        await chat.until("conversation.item.done")
                        resp = await chat.respond({"tool_choice": "none"})
                else:
                    resp = await chat.respond()
            answers.append(answer_text(resp))
            if log:
                print(f"    {t.text!r} -> {answers[-1][:100]!r}", file=sys.stderr, flush=True)
    return answers


# ============================================================================ report
def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    frac = lambda p: f"{p[0]}/{p[1]}"  # noqa: E731
    return "\n".join([
        "| answers | loops | repeated answers | off-language | empty | fact recall | tool results used | "
        "everyday facts right | issue's 12-turn recall | words mean |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {s['answers']} | {s['loops']} | {s['repeats']} | {s['off_language']} | {s['empty']} | {frac(s['recall'])} | "
        f"{frac(s['tool_use'])} | {frac(s['facts'])} | {frac(s['issue_conversation_recall'])} | {s['words_mean']} |"])


def header(result: dict[str, Any]) -> str:
    return (f"`python -m latency_bench conversations` ({result['when']}, preset `{result['preset']}`, thinker "
            f"{result['thinker']}, commit {result['commit']}, {result['summary']['conversations']} conversations, "
            f"{result['wall_s']:.0f} s)")


def worst(result: dict[str, Any], n: int = 6) -> list[str]:
    rows = [r for c in result["conversations"] for r in c]
    bad = [r for r in rows if r["loop"] or r["repeat"] or r["off_language"] or r.get("right") is False]
    return [f"- {r['user']!r} -> {r['answer'][:140]!r}" for r in bad[:n]]


def update_docs(result: dict[str, Any], label: str) -> None:
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    text = DOCS.read_text() if DOCS.exists() else (
        "# Multi-turn conversations\n\n" + __doc__.split("\n\n", 1)[1].split("\n\nPrints")[0] + "\n")
    block = f"## {label}\n\n{header(result)}\n\n{table(result)}\n\nSome answers that missed:\n\n" + "\n".join(worst(result)) + "\n"
    start = text.find(f"\n## {label}\n")
    if start == -1:
        text = text.rstrip("\n") + "\n\n" + block
    else:
        end = text.find("\n## ", start + 4)
        text = text[: start + 1] + block + (text[end:] if end != -1 else "")
    DOCS.write_text(text)


def _commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from latency_bench.server_proc import Server

    convs = CONVERSATIONS[: args.limit] if args.limit else CONVERSATIONS
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if args.url:
            url, server = args.url, None
        else:
            server = Server(args.preset, "conversations", Path(tmp), thinker=args.thinker).start()
            url = server.ws_url
        try:
            answers = []
            for i, conv in enumerate(convs):
                print(f"  conversation {i + 1}/{len(convs)}", file=sys.stderr, flush=True)
                answers.append(await run_conversation(url, conv, args.timeout, instructions=args.instructions))
        finally:
            if server is not None:
                server.stop()
    scored = [score_conversation(c, a) for c, a in zip(convs, answers)]
    return {"when": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "preset": args.preset,
            "thinker": args.thinker or "the preset's", "commit": _commit(), "label": args.label,
            "instructions": args.instructions,
            "wall_s": round(time.perf_counter() - t0, 1), "cpus": os.cpu_count(),
            "summary": summary(scored), "conversations": scored}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="cpu", help="cpu | gpu | YAML path (default cpu)")
    p.add_argument("--thinker", default=None, metavar="MODEL", help="omni-rt serve --thinker MODEL (.gguf or http(s)://HOST:PORT/v1)")
    p.add_argument("--url", default=None, help="use a running server (ws://HOST:PORT) instead of starting one")
    p.add_argument("--limit", type=int, default=None, help="the first N conversations only")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for one turn")
    p.add_argument("--instructions", default=None, help="the session's instructions (default: the preset's)")
    p.add_argument("--label", default="latest", help="heading of this run in the docs page (baseline, after, ...)")
    p.add_argument("--out", default=str(RESULTS / "conversations.json"))
    p.add_argument("--update-docs", action="store_true", help=f"write the table into {DOCS.relative_to(ROOT)}")


def command(args: argparse.Namespace) -> int:
    """``python -m latency_bench conversations``."""
    result = asyncio.run(run(args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(out.read_text()) if out.exists() else {}
    runs = runs if isinstance(runs, dict) and "summary" not in runs else {}
    runs[args.label] = result
    out.write_text(json.dumps(runs, indent=1, ensure_ascii=False))
    print(header(result) + "\n\n" + table(result) + "\n\n" + "\n".join(worst(result)))
    if args.update_docs:
        update_docs(result, args.label)
    print(f"wrote {out}" + (f" and {DOCS}" if args.update_docs else ""))
    return 0

