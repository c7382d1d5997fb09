"""``python -m latency_bench COMMAND``: omni-rt's benchmarks, one command per job.

    python -m latency_bench report --quick        # the latency report (< 5 min; without --quick < 15 min on 2 cores)
    python -m latency_bench turns                 # turn taking on the labelled set (~12 min)
    python -m latency_bench stages                # per-stage latency, in-process
    python -m latency_bench COMMAND --help        # each command's options

``python -m latency_bench [OPTIONS]`` with no command is ``report [OPTIONS]`` (as before the commands existed).
Results go to ``latency_bench/results/``; ``report --update-docs`` rewrites ``docs/benchmarks/index.md``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

PROG = "python -m latency_bench"

# command -> (module, one line); each module has add_arguments(parser) and command(args) -> exit status
COMMANDS: dict[str, tuple[str, str]] = {
    "report": ("latency_bench.sweep", "the latency report: concurrency sweep, barge-in and ablations over /v1/realtime"),
    "turns": ("latency_bench.turn_taking", "turn taking: server_vad vs semantic_vad on the labelled set (V2V, false ends)"),
    "soak": ("latency_bench.soak", "heavy + bystander + dropper sessions, then one long session: fairness and memory"),
    "quality": ("latency_bench.quality", "answer quality: words, language, key facts, Whisper on the spoken answers"),
    "language": ("latency_bench.language_bench", "answers in the voice's language under the instructions clients send"),
    "conversations": ("latency_bench.conversations", "conversations of 12-14 turns: loops, copies, language, fact recall, tool use"),
    "stages": ("latency_bench.stage_bench", "per-stage latency in-process (ASR, thinker, talker, vocoder); parts alone below"),
    "engine": ("latency_bench.engine_bench", "AR engine: tokens/s, TTFT, ms/step at 1/4/8 requests (torch, llama.cpp)"),
    "gpu": ("latency_bench.gpu", "the GPU preset on random weights of the real shapes (--smoke: on CPU, tiny)"),
    "webrtc": ("latency_bench.webrtc_bench", "WebRTC vs WebSocket in one run: V2V and TTFA at 1 and 4 sessions"),
    "live": ("latency_bench.live_bench", "GPT-Live vs Realtime in one run: V2V at 1 and 4 sessions, answers per turn"),
    "tools": ("latency_bench.tools_bench", "a 3 s tool call: first audio, dead air, answer using the result, preamble on/off"),
}
# parts of ``stages`` that run alone: ``python -m latency_bench stages PART``
STAGE_PARTS: dict[str, tuple[str, str]] = {
    "asr-batch": ("latency_bench.asr_batch", "ASR throughput when several sessions commit at once, per max_batch"),
    "vocoder": ("latency_bench.vocoder_bench", "SNAC vocoder stream-frames per second, batched vs one stream at a time"),
    "overhead": ("latency_bench.pipeline_overhead", "the pipeline runtime's own cost: per hop, and a lone request's wait"),
    "noise": ("latency_bench.noise_bench", "noise reduction (RNNoise): CPU per stream, delay, Whisper accuracy in noise"),
    "backchannel": ("latency_bench.backchannel_bench", "backchannels vs interruptions over a heard answer: rates, onset -> decision"),
    "listener-probe": ("latency_bench.listener_probe", "does Whisper's encoder hear a listener's sound: a probe fitted on a synthetic corpus, AUC on the backchannel sets"),
}
# options that say where files go, not what is measured: left out of the command a report shows
_NOT_SHOWN = ("--log-dir", "--out", "--png", "--note")


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command listed; ``command``'s options are added (its module imported) only for the
    command given, so ``--help`` and a light command do not import torch for the others."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=fmt)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    p.set_defaults(_parsers={})  # command (or "stages PART") -> its parser, for its errors
    for name, (mod, line) in COMMANDS.items():
        loaded = _module(mod) if name == command else None
        sp = sub.add_parser(name, help=line, description=loaded.__doc__ if loaded else line, formatter_class=fmt)
        p.get_default("_parsers")[name] = sp
        if loaded is None:
            continue
        loaded.add_arguments(sp)
        if name == "stages":
            parts = sp.add_subparsers(dest="part", metavar="PART", title="parts (each alone, with its own options)")
            for part, (pmod, pline) in STAGE_PARTS.items():
                pm = _module(pmod)
                pp = parts.add_parser(part, help=pline, description=pm.__doc__, formatter_class=fmt)
                pm.add_arguments(pp)
                p.get_default("_parsers")[f"stages {part}"] = pp
    return p


def parse_args(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """(parser of the command run, its args); no command (options only, or nothing) means ``report``."""
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["report", *argv]
    command = argv[0] if argv[0] in COMMANDS else None
    parser = build_parser(command)
    args = parser.parse_args(argv)
    parsers = vars(args).pop("_parsers")
    sub = parsers[f"stages {args.part}" if getattr(args, "part", None) else args.command]
    # the command shown in a report: what changes the measurement, not where files go
    shown, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _NOT_SHOWN:
            skip = True
            continue
        if a == "--update-docs" or a.split("=", 1)[0] in _NOT_SHOWN:
            continue
        shown.append(a)
    args.argv = shown
    return sub, args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    sub, args = parse_args(argv)
    if getattr(args, "thinker", None) and getattr(args, "url", None):
        sub.error("--thinker chooses the thinker of the servers started here; --url measures a running server as it is")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    module = _module(COMMANDS[args.command][0])
    if getattr(args, "part", None):
        module = _module(STAGE_PARTS[args.part][0])
    from omni_rt.engine.weights.thinker_choice import ThinkerError

    try:
        return int(module.command(args) or 0)
    except ThinkerError as exc:  # a wrong --thinker: one line, before anything is synthesized or started
        print(f"{sub.prog}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
