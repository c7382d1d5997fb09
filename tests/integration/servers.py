"""A real `omni-rt serve` on 127.0.0.1 for the integration tests: start, wait until healthy, stop.

``ROOT`` is the repository (the server runs from it, like a user's checkout).
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
KEYED_API_KEY = "sekret"  # conftest's ``keyed_server``: its API key and message limit
KEYED_MAX_MESSAGE_BYTES = 64 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    http_url: str
    ws_url: str
    proc: subprocess.Popen
    log_path: Path
    api_key: str | None = None

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def state(self) -> dict:
        return httpx.get(f"{self.http_url}/debug/state", headers=self.auth_headers, timeout=10).json()

    def wait_idle(self, timeout: float = 15.0) -> dict:
        """Poll until the runtime holds no per-request state (sessions closed, answers finished)."""
        deadline = time.time() + timeout
        state = self.state()
        while time.time() < deadline:
            if state["total"] == 0 and state["sessions"] == 0:
                return state
            time.sleep(0.1)
            state = self.state()
        return state


def start_server(tmp_dir: Path, *extra: str, env: dict | None = None, nofile: int | None = None) -> LiveServer:
    """``nofile``: the server process's open-file limit (RLIMIT_NOFILE, soft and hard), as ``ulimit -n`` would.
    (The server binds its port at once, before its models load, so no child it starts can take the port.)"""
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        # WebRTC calls on the loopback too: no test packet goes to another address of this machine
        [sys.executable, "-m", "omni_rt.cli", "serve", "--port", str(port), "--webrtc-host", "127.0.0.1", *extra],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                key = extra[extra.index("--api-key") + 1] if "--api-key" in extra else None
                return LiveServer(url, f"ws://127.0.0.1:{port}", proc, log_path, key)
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"server did not become healthy:\n{log_path.read_text()[-4000:]}")


def stop_server(server: LiveServer) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
