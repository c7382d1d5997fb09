"""The servers a bench run starts: ``omni-rt serve`` subprocesses on free ports of 127.0.0.1, each with its log
file, and the one-line name of the thinker a run measures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PRESETS_DIR = Path(__file__).resolve().parent / "presets"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``omni-rt serve`` subprocess of ``preset`` on a free port; ``thinker``: its ``--thinker MODEL``."""

    def __init__(self, preset: str, name: str, log_dir: Path, max_sessions: int = 64, extra: list[str] | None = None,
                 thinker: str | None = None) -> None:
        self.preset, self.name, self.log_dir, self.max_sessions = preset, name, log_dir, max_sessions
        self.extra = list(extra or []) + (["--thinker", thinker] if thinker else [])
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.startup_s = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "omni_rt.cli", "serve", "--port", str(self.port), "--preset", self.preset,
                "--max-sessions", str(self.max_sessions), "--log-level", "warning", *self.extra]

    def start(self, timeout: float = 300.0) -> "Server":
        import httpx

        self.port = free_port()
        self.log_path = self.log_dir / f"server-{self.name}-{self.port}.log"
        logf = open(self.log_path, "w")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.command(), cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server '{self.name}' exited with {self.proc.returncode}:\n{self.log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{self.http_url}/healthz", timeout=1).status_code == 200:
                    self.startup_s = round(time.perf_counter() - t0, 1)
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"server '{self.name}' not healthy after {timeout:.0f} s:\n{self.log_path.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def bench_server(args: Any, preset: str, name: str, log_dir: Path, extra: list[str] | None = None, **kw: Any) -> Server:
    """A server this run starts: ``preset`` with the run's ``--thinker`` (not started yet)."""
    return Server(preset, name, log_dir, extra=extra, thinker=getattr(args, "thinker", None), **kw)


def measured_thinker(args: Any) -> str:
    """The thinker the run measures, one line for its report (checks ``--thinker`` before any server starts)."""
    if getattr(args, "url", None):
        return f"the running server's at {args.url}"
    from omni_rt.inventory import thinker_line

    return thinker_line(args.preset, getattr(args, "thinker", None), os.environ.get("OMNI_RT_THINKER_API_KEY"))
