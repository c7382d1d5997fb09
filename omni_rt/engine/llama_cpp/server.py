"""llama.cpp as the CPU thinker, part 2: one supervised ``llama-server`` child on a private 127.0.0.1 port.

Why a server process and not ``llama-cpp-python`` in-process: ``llama-server`` already does what many voice
sessions need — continuous batching across slots, a per-slot prompt cache (``cache_prompt``; a RAM prompt
cache across slots, ``--cache-ram``, is off by default: ``cache_ram_mib``), SSE streaming,
cancel-on-disconnect, ``--jinja`` chat templates with tool calls and ``json_schema`` grammars — while the
in-process binding serves one sequence at a time behind a lock. The server speaks the OpenAI API, so the
existing ``RemoteThinker`` drives it unchanged.

The binary comes from ``omni_rt.engine.llama_cpp`` (build/locate); the scheduler that drives the server is
``omni_rt.engine.llama_cpp.thinker``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from omni_rt.resources import cache_root

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# a private 127.0.0.1 port: never route the health check through an http_proxy from the environment
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _prune_logs(folder: Path, keep: int) -> None:
    """One log per serving process: keep the newest ``keep`` so the cache folder does not grow forever."""
    with contextlib.suppress(OSError):
        logs = sorted(folder.glob("llama-server-*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in logs[keep:]:
            old.unlink(missing_ok=True)


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL the child when the thread that spawned it dies (the supervisor, or the whole parent)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class LlamaServerArgs:
    """``llama-server``'s command line as omni-rt runs it, written once: the factory (a preset's thinker args),
    ``create_llama_cpp_thinker``, the engine bench and the tests all build one of these, and ``LlamaServer``
    spawns ``argv(port)``. The port is the server's own (a restart may move it), not part of the arguments."""

    model: str | os.PathLike
    threads: int = 1
    parallel: int = 4
    ctx_size: int = 8192
    cache_ram_mib: int = 0
    batch_tokens: int | None = 16
    unified_kv: bool = False
    cache_reuse_tokens: int = 64
    extra_args: Sequence[str] = ()
    host: str = "127.0.0.1"

    def argv(self, port: int | str = "{port}") -> list[str]:
        """The arguments after the binary's path (``{port}``, the default, is filled in at each spawn)."""
        return [
            "-m", str(Path(self.model)), "--host", self.host, "--port", str(port), "-a", "omni-rt-thinker",
            "-t", str(self.threads), "-tb", str(self.threads), "--poll", "0",
            "-c", str(self.ctx_size), "--parallel", str(self.parallel), "--kv-unified" if self.unified_kv else "--no-kv-unified",
            # no host-RAM prompt cache by default: each session keeps its own slot (the slot picker), so it only
            # helps when sessions outnumber slots, and it grows the RSS by its cap over a run (docs/tuning-cpu.md,
            # "prompt cache in RAM")
            "--cont-batching", "--cache-ram", str(self.cache_ram_mib), "--jinja", "--no-webui", "--metrics", "--slots",
            *(("-b", str(self.batch_tokens), "-ub", str(self.batch_tokens)) if self.batch_tokens else ()),
            # a trailing assistant message is a whole turn, not a prefix to continue: a response.create with no
            # new user input starts a new answer (with prefill, llama-server continued the last reply, and
            # refused two assistant messages at the end: "Cannot have 2 or more assistant messages ...")
            "--no-prefill-assistant",
            # no weight repacking: on a CPU with AVX-512 + AMX the vendored llama.cpp crashes at load (SIGSEGV or
            # SIGILL) repacking a Q4_1 or Q8_0 GGUF; F16 is not repacked either way
            "--no-repack",
            # a history trimmed at its front (omni_rt.engine.prompt.history drops the oldest turns) keeps the slot's KV of
            # the rest: llama-server finds chunks of >= N cached tokens past the change and shifts them into place
            # (RoPE re-rotation) instead of re-evaluating them, so a trim costs a few tokens, not the whole kept
            # history (docs/tuning-cpu.md, "cache reuse"). 0 turns it off.
            *(("--cache-reuse", str(self.cache_reuse_tokens)) if self.cache_reuse_tokens else ()),
            *self.extra_args,
        ]  # fmt: skip


class LlamaServer:
    """One supervised ``llama-server`` on a private 127.0.0.1 port.

    Fairness (issue #26): ``batch_tokens`` (``-b``/``-ub``, default 16 instead of 2048/512) bounds the tokens of
    one forward, so a heavy session's long prefill is cut into 16-token batches that the others' prompts and
    decode tokens join instead of waiting behind the whole prefill. Smaller batches help a bystander more while a
    lone long prompt takes the same time, but 8 leaves a new prompt only one token per step beside 7 decoding
    slots (the numbers: docs/tuning-cpu.md, "batch size"; docs/benchmarks/soak.md); per-slot KV (``unified_kv=False``: ``ctx_size / parallel`` tokens each) keeps each
    session's prefix in its own slot and its attention over its own cells only — with one unified KV every
    forward attends over every slot's cells, and an idle slot's prefix is copied out to the RAM cache and
    cleared at each new request. The scheduler picks slots so a short new part goes first in each batch.

    A supervisor thread spawns it (in its own process group, with PDEATHSIG so it dies with us), waits for
    ``/health``, and respawns it when it exits unexpectedly. The spawn happens on that long-lived thread
    because PDEATHSIG fires when the *spawning thread* exits.
    """

    def __init__(
        self,
        binary: str | os.PathLike,
        args: LlamaServerArgs,
        *,
        port: int | None = None,
        ready_timeout_s: float = 60.0,
        log_path: str | os.PathLike | None = None,
    ) -> None:
        self.binary = Path(binary)
        self.model = Path(args.model)
        self.host = args.host
        self.port = port or free_port(self.host)
        self.ready_timeout_s = ready_timeout_s
        self.server_args = args
        self.args = args.argv()
        self.log_path = Path(log_path) if log_path else cache_root() / "llama.cpp" / "logs" / f"llama-server-{os.getpid()}.log"
        self.ctx_size, self.parallel = int(args.ctx_size), int(args.parallel)
        self.batch_tokens = args.batch_tokens
        self.cache_reuse_tokens = int(args.cache_reuse_tokens)
        self.props: dict[str, Any] = {}  # GET /props of the running server (its real slot context, slot count)
        self.restarts = 0
        self.proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._failed: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self._ready.is_set()

    def launch(self) -> None:
        """Spawn the server under its supervisor and return at once: the model loads in its own process while
        the caller goes on (the pipeline builds its other stages meanwhile); ``start`` waits for it."""
        if self._thread is not None:
            return
        self._stop.clear()  # a stopped server may be started again
        self._failed = None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        _prune_logs(self.log_path.parent, keep=20)
        self._thread = threading.Thread(target=self._supervise, name="llama-server-supervisor", daemon=True)
        self._thread.start()

    def start(self) -> None:
        """Launch (unless launched) and wait until ``/health`` answers 200; raises RuntimeError if it cannot
        come up."""
        if self._ready.is_set():
            return
        self.launch()
        deadline = time.monotonic() + self.ready_timeout_s + 5
        while not self._ready.wait(0.05):
            if self._failed or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama-server did not start: {self._failed or 'timeout'}; log: {self.log_path}")

    def stop(self, grace_s: float = 3.0) -> None:
        """Stop the supervisor and the server's whole process group."""
        self._stop.set()
        self._kill(grace_s)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=grace_s + 2)
        self._thread = None

    @property
    def slot_context(self) -> int:
        """Tokens one request may hold, as the server reports it (``n_ctx`` per slot: ``ctx_size / parallel``,
        or the whole unified KV, capped at the model's training context); ``ctx_size`` when it did not say."""
        n = (self.props.get("default_generation_settings") or {}).get("n_ctx")
        return int(n) if isinstance(n, int) and n > 0 else self.ctx_size

    def _read_props(self) -> None:
        try:
            with _NO_PROXY.open(self.base_url + "/props", timeout=2.0) as r:
                self.props = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.warning("llama-server /props unreadable (%s); assuming %d tokens per slot", exc, self.ctx_size)

    def wait_ready(self, timeout_s: float) -> bool:
        """True once a live, healthy server is up (after a crash: the restarted one)."""
        deadline = time.monotonic() + timeout_s
        while not self.alive:
            if time.monotonic() > deadline or self._stop.is_set():
                return False
            time.sleep(0.02)
        return True

    # -- internals
    def _kill(self, grace_s: float) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def _spawn(self) -> subprocess.Popen:
        args = [a.replace("{port}", str(self.port)) for a in self.args]
        with open(self.log_path, "a") as lf:
            lf.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {self.binary} {' '.join(args)}\n")
            lf.flush()
            return subprocess.Popen(
                [str(self.binary), *args], stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl call
            )

    def _healthy(self) -> bool:
        try:
            with _NO_PROXY.open(self.base_url + "/health", timeout=1.0) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _wait_healthy(self, proc: subprocess.Popen) -> str | None:
        """None once healthy, else why not (it exited, or timed out)."""
        deadline = time.monotonic() + self.ready_timeout_s
        while not self._stop.is_set():
            if proc.poll() is not None:
                return f"exited with code {proc.returncode} before it was ready"
            if self._healthy():
                return None
            if time.monotonic() > deadline:
                return f"no healthy /health after {self.ready_timeout_s:.0f} s"
            time.sleep(0.05)
        return "stopped"

    def _supervise(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self._ready.clear()
            self.proc = proc = self._spawn()
            why = self._wait_healthy(proc)
            if why is not None:
                self._kill(1.0)
                if self._stop.is_set():
                    return
                failures += 1
                if self.restarts == 0 and failures == 1 and "exited" in why:
                    self.port = free_port(self.host)  # maybe the port was taken meanwhile: one retry elsewhere
                    continue
                if self.restarts == 0:  # never came up: report to start() instead of looping forever
                    self._failed = why
                    return
                log.error("llama-server restart failed (%s); retrying in %.1f s", why, min(5.0, 0.5 * failures))
                self._stop.wait(min(5.0, 0.5 * failures))
                if failures >= 2:
                    self.port = free_port(self.host)
                continue
            failures = 0
            self._read_props()
            self._ready.set()
            log.info("llama-server pid %d ready on %s", proc.pid, self.base_url)
            while not self._stop.is_set():
                try:
                    proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
            if self._stop.is_set():
                return
            self._ready.clear()
            self.restarts += 1
            log.warning("llama-server pid %d exited (code %s); restarting it (restart %d); log: %s",
                        proc.pid, proc.returncode, self.restarts, self.log_path)
