"""``omni-rt`` command line: ``serve`` (the realtime server), ``prepare`` (cache weights) and ``models`` (what
is cached, what each preset uses). Benchmarks are ``python -m latency_bench`` from a checkout."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omni-rt", description="Realtime speech-to-speech server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve /v1/realtime, the Twilio bridge and the demo page")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--preset", default=None, help="cpu (default, offline) | gpu | path to a YAML/TOML pipeline")
    serve.add_argument("--thinker", default=None, metavar="MODEL", help="the thinker instead of the preset's: a "
                       ".gguf file, or http(s)://HOST:PORT/v1 of an OpenAI-compatible server (SGLang, vLLM, "
                       "llama.cpp, Ollama); its key from OMNI_RT_THINKER_API_KEY")
    serve.add_argument("--api-key", default=None, help="require this bearer token (prefer OMNI_RT_API_KEY or "
                       "--api-key-file: argv is visible to other users)")
    serve.add_argument("--api-key-file", default=None, help="read the bearer token from this file")
    serve.add_argument("--max-sessions", type=int, default=None)
    serve.add_argument("--allowed-origin", action="append", default=None, dest="allowed_origins")
    serve.add_argument("--max-message-bytes", type=int, default=None)
    serve.add_argument("--max-connections", type=int, default=None,
                       help="cap on connections held (default: derived from the open-file limit)")
    serve.add_argument("--connect-timeout-s", type=float, default=None,
                       help="time a connection gets to complete its request headers (default 5)")
    serve.add_argument("--shutdown-grace-s", type=float, default=None, help="time open answers get at SIGTERM")
    serve.add_argument("--no-speculative", action="store_false", dest="speculative_responses", default=None,
                       help="do not start answers during the end-of-turn silence (for comparisons)")
    serve.add_argument("--no-backchannel-filter", action="store_false", dest="backchannel_filter", default=None,
                       help="every speech start over an answer barges in at once (default: backchannels such as "
                       "'yeah' and 'mm-hm' keep the answer)")
    serve.add_argument("--tool-preamble", choices=["auto", "off"], default=None,
                       help="say a short phrase before a tool call the model wrote no words for (default auto)")
    serve.add_argument("--live-delegation", choices=["auto", "always", "off"], default=None,
                       help="GPT-Live (/v1/live/sessions): when the voice delegates a user turn to the client's "
                       "backend: the thinker decides (auto), every turn (always), never (off, default)")
    serve.add_argument("--delegate", default=None, metavar="URL",
                       help="GPT-Live Responses delegation: http(s)://HOST:PORT/v1 of an OpenAI-compatible server "
                       "(key in OMNI_RT_DELEGATE_API_KEY)")
    serve.add_argument("--webrtc-host", action="append", default=None, dest="webrtc_hosts", metavar="IP",
                       help="bind WebRTC calls' UDP sockets on this address and offer it as their ICE candidate "
                       "(repeat for more; default: every interface address but loopback). 127.0.0.1: local only")
    serve.add_argument("--webrtc-advertise-address", default=None, metavar="IP",
                       help="offer this address in the SDP answer instead of the bound one (a 1:1 NAT's public IP)")
    serve.add_argument("--webrtc-port-min", type=int, default=None, metavar="PORT",
                       help="with --webrtc-port-max: the UDP port range of WebRTC calls (one port per call and address)")
    serve.add_argument("--webrtc-port-max", type=int, default=None, metavar="PORT")
    serve.add_argument("--webrtc-connect-timeout-s", type=float, default=None, metavar="S",
                       help="time an answered WebRTC call gets to connect before it is freed (default 10)")
    serve.add_argument("--webrtc-max-pending-calls", type=int, default=None, metavar="N",
                       help="WebRTC calls waiting to connect at once (default 32; one more: 503)")
    serve.add_argument("--webrtc-max-pending-per-client", type=int, default=None, metavar="N",
                       help="of those, from one client IP address (default 8; one more: 429)")
    serve.add_argument("--random-weights", nargs="?", const="full", default=None, choices=["full", "tiny"],
                       help="random weights of the real model shapes on every stage that supports it (no hub "
                       "weights needed: for benchmarks); 'tiny' shrinks them for a CPU smoke run")
    serve.add_argument("--log-level", default="info")
    prep = sub.add_parser("prepare", help="prepare and cache the weights a preset needs (GGUF -> safetensors)")
    prep.add_argument("--preset", default="cpu")
    sub.add_parser("models", help="list what is cached and which model each preset's stages use (offline)")
    args, rest = parser.parse_known_args(argv)

    if args.command == "models":
        from omni_rt.inventory import report

        print(report())
        return 0

    if args.command == "prepare":
        from omni_rt.prepare import prepare

        prepare(args.preset)
        return 0

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):  # the operator's own: no --thinker repo download either
        os.environ.setdefault("OMNI_RT_ALLOW_THINKER_DOWNLOAD", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no stage reaches a hub behind the operator's back
    from omni_rt.server.serve import serve
    from omni_rt.server.settings import ServerSettings

    overrides = {k: v for k, v in vars(args).items() if k in ServerSettings.model_fields and v is not None}
    if args.api_key_file:
        overrides["api_key"] = open(args.api_key_file).read().strip()
    settings = ServerSettings(**overrides)
    if settings.thinker:  # checked before anything loads: a wrong choice is one line, not a traceback
        from omni_rt.engine.weights.thinker_choice import ThinkerError, thinker_args

        try:
            thinker_args(settings.thinker, settings.thinker_api_key)
        except ThinkerError as exc:
            print(f"omni-rt: error: {exc}", file=sys.stderr)
            return 2
    serve(settings, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
