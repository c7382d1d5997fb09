"""``python -m latency_bench``: the realtime latency report (see ``latency_bench/realtime_bench.py``).

    python -m latency_bench                 # CPU preset: sweep 1, 2, 4 sessions + ablations (< 15 min on 2 cores)
    python -m latency_bench --quick         # sweep 1, 2 sessions, 2 turns each, short ablations (< 5 min)
    python -m latency_bench --preset gpu    # GPU machine: sweep 1, 4, 16 sessions
    python -m latency_bench --url ws://127.0.0.1:8000 --sessions 1,8   # load a running server (no ablations)
    python -m latency_bench --thinker my-model.gguf --sessions 1,4 --variants none   # another thinker, 1 and 4 sessions
    python -m latency_bench.stages          # per-stage latency, in-process, CPU preset
    python -m latency_bench --turn-detection server_vad,semantic_vad   # turn taking on the labelled set (~12 min)
"""

from __future__ import annotations

import argparse
import os
import sys

from latency_bench import report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m latency_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short run: levels 1,2; 2 turns; one barge-in; 2-turn ablations of 4 variants")
    p.add_argument("--preset", default="cpu", help="base preset for the servers started here: cpu | gpu | YAML path")
    p.add_argument("--thinker", default=None, metavar="MODEL",
                   help="every server started here runs this thinker (omni-rt serve --thinker: a .gguf file or "
                        "http(s)://HOST:PORT/v1); the report names it. The 'torch' ablation is skipped with it")
    p.add_argument("--url", default=None, help="ws://HOST:PORT of a running server (skips server start and ablations)")
    p.add_argument("--sessions", default=None, help="concurrency levels, comma-separated (default 1,2,4; gpu 1,4,16)")
    p.add_argument("--turns", type=int, default=None, help="questions per session per level (default 4; quick 2)")
    p.add_argument("--ablation-turns", type=int, default=None, help="questions per ablation variant (default 3; quick 2)")
    p.add_argument("--variants", default=None,
                   help="comma-separated: streaming,naive,no_held,no_async,no_prefix,windowed (default all; quick: streaming,naive,no_held,windowed; 'none' to skip)")
    p.add_argument("--no-barge", action="store_true", help="skip the barge-in turns")
    p.add_argument("--chunk-ms", type=int, default=20, help="microphone chunk, sent at its real-time instant (20-40)")
    p.add_argument("--gap-s", type=float, default=0.8, help="pause after an answer before the next question")
    p.add_argument("--pace", choices=("done", "playback"), default="done",
                   help="the pause starts at the answer's response.done (default) or once its audio has played")
    p.add_argument("--barge-delay-s", type=float, default=0.3, help="talk over the answer this long after its first audio")
    p.add_argument("--turn-timeout", type=float, default=90.0, help="seconds a turn may take before it counts as failed")
    p.add_argument("--no-warmup", action="store_true", help="skip the unrecorded warm-up turn on each server")
    p.add_argument("--out", default=str(report.RESULTS_DIR / "latest.json"))
    p.add_argument("--png", default=str(report.RESULTS_DIR / "latest.png"))
    p.add_argument("--log-dir", default=None, help="keep server logs here (default: a temp dir)")
    p.add_argument("--note", action="append", help="a note printed with the report (repeatable)")
    p.add_argument("--turn-detection", default=None,
                   help="turn-taking run instead of the report: comma-separated modes (server_vad,semantic_vad), each on the "
                        "same server: complete questions (V2V/TTFA) and hesitant ones (false end-of-turn rate)")
    p.add_argument("--hesitant", type=int, default=None,
                   help="hesitant utterances per session at 1 session (turn-taking run; default: all of the labelled set's)")
    p.add_argument("--max-output-tokens", type=int, default=32, help="answer length cap in the turn-taking run")
    p.add_argument("--update-readme", action="store_true", help="rewrite README.md's '## Benchmarks' section")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.thinker and args.url:
        parser.error("--thinker chooses the thinker of the servers started here; --url measures a running server as it is")
    # the command shown in the report: what changes the measurement, not where files go
    shown, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--log-dir", "--out", "--png", "--note"):
            skip = True
            continue
        if a == "--update-readme" or a.split("=", 1)[0] in ("--log-dir", "--out", "--png", "--note"):
            continue
        shown.append(a)
    args.argv = shown
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from latency_bench.realtime_bench import main as run_main
    from latency_bench.realtime_bench import main_turn_taking
    from omni_rt.engine.weights.thinker_choice import ThinkerError

    try:
        return main_turn_taking(args) if args.turn_detection else run_main(args)
    except ThinkerError as exc:  # a wrong --thinker: one line, before anything is synthesized or started
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
