"""llama.cpp as the CPU thinker: build ``llama-server`` once from source, find it, and run it as a managed child.

Why a server process and not ``llama-cpp-python`` in-process: ``llama-server`` already does what many voice
sessions need — continuous batching across slots, a per-slot prompt cache (``cache_prompt``) plus a RAM
prompt cache across slots (``--cache-ram``), SSE streaming, cancel-on-disconnect, ``--jinja`` chat templates
with tool calls and ``json_schema`` grammars — while the in-process binding serves one sequence at a time
behind a lock. The server speaks the OpenAI API, so the existing ``RemoteScheduler`` drives it unchanged.

Source: the MIT-licensed llama.cpp tree vendored in the ``llama-cpp-python`` sdist on PyPI (the only reachable
source; no binary downloads). Only the ``llama-server`` target is built (Release, static, ``-j 2``), logged to a
file, and cached in ``~/.cache/omni-rt/llama.cpp/<version>-<key>/`` where the key hashes what makes a binary
valid (source version, build flags, CPU arch and features: ``GGML_NATIVE`` uses this CPU's instructions).
A failed build leaves a ``FAILED`` marker next to its log so callers can tell "not built yet" from "cannot build".

Run ``python -m omni_rt.engine.llama_cpp build`` (``scripts/install.sh`` does) or ``... locate``.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, AsyncIterator, Sequence

from omni_rt.engine.smollm2 import cache_root

log = logging.getLogger(__name__)

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the sdist whose vendor/llama.cpp we build
BINARY_NAME = "llama-server"
# Static (one self-contained file to cache), no network at build time (no prebuilt web UI from a hub, no
# curl/openssl), no OpenMP (ggml's own thread pool, so ``--poll`` can stop idle spinning on shared cores).
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DGGML_OPENMP=OFF",
    "-DGGML_CCACHE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)
_STAMP = "build.json"


_FAILED = "FAILED"


# ----------------------------------------------------------------------------------------------- locate/build
def _cpu_features() -> str:
    """The CPU's instruction-set flags (what a ``-march=native`` binary depends on), empty where unknown."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    return ""


def build_key() -> str:
    """Hash of everything that makes a cached binary valid on this machine."""
    parts = [LLAMA_CPP_PYTHON_VERSION, *CMAKE_FLAGS, platform.system(), platform.machine(), _cpu_features()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def build_dir(root: str | os.PathLike | None = None) -> Path:
    """``<root>/<version>-<key>``; root defaults to ``$OMNI_RT_CACHE/llama.cpp`` (``~/.cache/omni-rt/llama.cpp``)."""
    base = Path(root) if root is not None else cache_root() / "llama.cpp"
    return base / f"{LLAMA_CPP_PYTHON_VERSION}-{build_key()}"


def locate_binary(root: str | os.PathLike | None = None) -> Path | None:
    """The cached ``llama-server`` if it is valid here, else None. ``OMNI_RT_LLAMA_SERVER`` names one explicitly."""
    explicit = os.environ.get("OMNI_RT_LLAMA_SERVER")
    if explicit and root is None:
        p = Path(explicit)
        return p if p.is_file() and os.access(p, os.X_OK) and _runs(p) else None
    d = build_dir(root)
    binary, stamp = d / BINARY_NAME, d / _STAMP
    if not (binary.is_file() and os.access(binary, os.X_OK) and stamp.is_file()):
        return None
    try:
        if json.loads(stamp.read_text()).get("key") != build_key():
            return None
    except (OSError, ValueError):
        return None
    return binary if _runs(binary) else None


def _runs(binary: Path) -> bool:
    """``llama-server --version`` exits 0 (~50 ms): a copied cache or a changed libc/CPU cannot break serving."""
    try:
        return subprocess.run([str(binary), "--version"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def build_failed(root: str | os.PathLike | None = None) -> str | None:
    """The reason of the last failed build for this key (its marker's text), or None."""
    marker = build_dir(root) / _FAILED
    with contextlib.suppress(OSError):
        return marker.read_text().strip() or "build failed"
    return None


def _run_logged(cmd: Sequence[str], log_file, cwd: Path | None = None) -> None:
    log_file.write(f"\n$ {' '.join(map(str, cmd))}\n")
    log_file.flush()
    subprocess.run(list(map(str, cmd)), cwd=cwd, stdout=log_file, stderr=subprocess.STDOUT, check=True)


def _fetch_source(work: Path, log_file) -> Path:
    """Download the sdist with pip (PyPI only) and extract just ``vendor/llama.cpp``."""
    _run_logged(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", work],
        log_file,
    )
    sdists = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        raise RuntimeError(f"pip download left no llama_cpp_python sdist in {work}")
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdists[0]) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(work, members=members, filter="data")
    return work / prefix


def build(root: str | os.PathLike | None = None, *, jobs: int = 2, force: bool = False) -> Path:
    """Build and cache ``llama-server`` (minutes, once); returns at once when the cache is valid.

    On failure writes the ``FAILED`` marker (reason + log path) and raises RuntimeError.
    """
    if not force and (found := locate_binary(root)) is not None:
        return found
    d = build_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    (d / _FAILED).unlink(missing_ok=True)
    log_path = d / "build.log"
    for tool in ("cmake", "ninja", "c++"):
        if shutil.which(tool) is None:
            reason = f"{tool} not found on PATH (apt-get install cmake ninja-build g++)"
            (d / _FAILED).write_text(reason)
            raise RuntimeError(reason)
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=".src-", dir=d))
    try:
        with open(log_path, "w") as lf:
            src = _fetch_source(work, lf)
            bdir = work / "build"
            _run_logged(["cmake", "-S", src, "-B", bdir, "-G", "Ninja", *CMAKE_FLAGS], lf)
            _run_logged(["cmake", "--build", bdir, "--target", BINARY_NAME, "-j", str(jobs)], lf)
            _run_logged([bdir / "bin" / BINARY_NAME, "--version"], lf)  # it runs on this CPU
            tmp = d / f".{BINARY_NAME}.tmp"
            shutil.copy2(bdir / "bin" / BINARY_NAME, tmp)
            os.replace(tmp, d / BINARY_NAME)
            stamp = {"key": build_key(), "version": LLAMA_CPP_PYTHON_VERSION, "flags": list(CMAKE_FLAGS),
                     "machine": platform.machine(), "seconds": round(time.monotonic() - t0, 1)}
            (d / _STAMP).write_text(json.dumps(stamp, indent=1))
    except (subprocess.CalledProcessError, OSError, RuntimeError, tarfile.TarError) as exc:
        (d / _FAILED).write_text(f"{exc}; see {log_path}")
        raise RuntimeError(f"llama.cpp build failed ({exc}); log: {log_path}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("built %s in %.0f s", d / BINARY_NAME, time.monotonic() - t0)
    return d / BINARY_NAME


# ----------------------------------------------------------------------------------------------- the process
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


class LlamaServer:
    """One supervised ``llama-server`` on a private 127.0.0.1 port.

    Fairness (issue #26, measured with ``latency_bench.soak``, heavy + bystander + dropper, 2 shared cores):
    ``batch_tokens`` (``-b``/``-ub``, default 16 instead of 2048/512) bounds the tokens of one forward, so a
    heavy session's long prefill is cut into 16-token batches that the others' prompts and decode tokens join
    instead of waiting behind the whole prefill. Bystander first-token / solo: 24.6x with the old flags,
    8.1x at 64, 4.9x at 32, 2.3x at 16, 1.8x at 8 (one run each, n=3-5); a lone 400-word prompt took the same
    ~2.5 s at 16, 64 and 2048, and 8 leaves a new prompt only one token per step beside 7 decoding slots; per-slot KV (``unified_kv=False``: ``ctx_size / parallel`` tokens each) keeps each
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
        model: str | os.PathLike,
        *,
        threads: int = 1,
        parallel: int = 4,
        ctx_size: int = 8192,
        cache_ram_mib: int = 256,
        batch_tokens: int | None = 16,
        unified_kv: bool = False,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        ready_timeout_s: float = 60.0,
        log_path: str | os.PathLike | None = None,
    ) -> None:
        self.binary = Path(binary)
        self.model = Path(model)
        self.host = host
        self.port = port or free_port(host)
        self.ready_timeout_s = ready_timeout_s
        self.args = [
            "-m", str(self.model), "--host", host, "--port", "{port}", "-a", "omni-rt-thinker",
            "-t", str(threads), "-tb", str(threads), "--poll", "0",
            "-c", str(ctx_size), "--parallel", str(parallel), "--kv-unified" if unified_kv else "--no-kv-unified",
            "--cont-batching", "--cache-ram", str(cache_ram_mib), "--jinja", "--no-webui", "--metrics", "--slots",
            *(("-b", str(batch_tokens), "-ub", str(batch_tokens)) if batch_tokens else ()),
            # a trailing assistant message is a whole turn, not a prefix to continue: a response.create with no
            # new user input starts a new answer (with prefill, llama-server continued the last reply, and
            # refused two assistant messages at the end: "Cannot have 2 or more assistant messages ...")
            "--no-prefill-assistant",
            *extra_args,
        ]  # fmt: skip
        self.log_path = Path(log_path) if log_path else cache_root() / "llama.cpp" / "logs" / f"llama-server-{os.getpid()}.log"
        self.ctx_size, self.parallel = int(ctx_size), int(parallel)
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

    def start(self) -> None:
        """Spawn and wait until ``/health`` answers 200; raises RuntimeError if it cannot come up."""
        if self._thread is not None:
            return
        self._stop.clear()  # a stopped server may be started again
        self._failed = None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        _prune_logs(self.log_path.parent, keep=20)
        self._thread = threading.Thread(target=self._supervise, name="llama-server-supervisor", daemon=True)
        self._thread.start()
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


# ----------------------------------------------------------------------------------------------- the scheduler
def language_logit_bias(tokenizer: Any, languages: tuple[str, ...]) -> list[list[Any]]:
    """The built-in engine's language bias (``omni_rt.engine.language.vocab_bias``) as llama-server's
    ``logit_bias``: ``[id, false]`` bans a token, ``[id, bias]`` adds to its logit. Sent with every request
    (925 entries, ~10 KB, for English on SmolLM2): the server runs the GGUF of the very tokenizer the ids
    come from, which a generic OpenAI-compatible upstream does not promise, so only this dialect gets it."""
    if tokenizer is None or not languages:
        return []
    from omni_rt.engine.language import vocab_bias

    bias = vocab_bias(tokenizer, languages, len(tokenizer))
    if bias is None:
        return []
    ids = bias.nonzero().flatten().tolist()
    return [[i, False if bias[i] == float("-inf") else round(float(bias[i]), 3)] for i in ids]


def answer_gbnf(still: list[dict]) -> str:
    """``auto`` once a tool's output is in (``tool_schema.callable_tools``), as llama.cpp GBNF: the built-in
    engine's ``constrained.answer_grammar`` — spoken text without call markup, or one call (own format)
    of a tool still callable, its arguments any JSON object — so the same answered call is not made again."""
    text = r'text ::= [^<{; \t\n\r] [^<]*'
    if not still:
        return f"root ::= text\n{text}\n"
    names = " | ".join(json.dumps(t["name"]) for t in still)
    return "\n".join([
        "root ::= text | call", text,
        r'call ::= "<tool_call>\n{\"name\": \"" name "\", \"arguments\": " object "}\n</tool_call>"',
        f"name ::= {names}",
        r'object ::= "{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}"',
        r'value ::= object | array | string | number | "true" | "false" | "null"',
        r'array ::= "[" ws ( value ( "," ws value )* )? "]"',
        r'string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] ) )* "\""',
        r'number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?',
        'ws ::= " "?',
    ]) + "\n"


def _make_scheduler_class():
    # imported lazily: keeps ``python -m omni_rt.engine.llama_cpp build`` free of httpx/engine imports
    import asyncio

    import dataclasses
    from collections import OrderedDict

    from omni_rt.engine.async_stream import Delta, UpstreamError
    from omni_rt.engine.constrained import closed, forced_tools, forces_call
    from omni_rt.engine.history import HistoryWindow
    from omni_rt.engine.remote import RemoteScheduler, request_body
    from omni_rt.engine.request import GenRequest
    from omni_rt.engine.tool_prompt import detect_format, render_prompt
    from omni_rt.engine.tool_schema import callable_tools

    TOOL_OPEN, TOOL_CLOSE = "<tool_call>\n", "\n</tool_call>"  # the own tool format (omni_rt.engine.tool_schema)
    FORCED_CALL_MAX_TOKENS = 384

    def forced_schema(req: GenRequest) -> dict[str, Any] | None:
        """For ``required`` / a named ``tool_choice``: the JSON schema of one call object, else None."""
        if not req.tools or not forces_call(req.tool_choice):
            return None
        options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                    "properties": {"name": {"const": t["name"]},
                                   "arguments": closed(t.get("parameters") or {"type": "object"})}}
                   for t in forced_tools(req.tools, req.tool_choice)]
        return options[0] if len(options) == 1 else {"anyOf": options}

    class LlamaCppScheduler(RemoteScheduler):
        """``RemoteScheduler`` over a managed ``llama-server``: start/stop own the process, and an answer
        broken by a crash fails with an error that says so (the supervisor restarts the server)."""

        def __init__(self, server: LlamaServer, history_tokens: int | None = None, heavy_prefill_tokens: int = 64,
                     **kwargs: Any) -> None:
            super().__init__(server.base_url + "/v1", **kwargs)
            self.server = server
            self.history_tokens = history_tokens
            self._slot_of: dict[str, tuple[int, bool]] = {}  # request in flight -> (its llama-server slot, heavy)
            self._last_slot: OrderedDict[str, int] = OrderedDict()  # session -> the slot its last request used
            self.heavy_prefill_tokens = heavy_prefill_tokens
            self.logit_bias = language_logit_bias(self.tokenizer, self.languages)

        @property  # type: ignore[override]
        def base_url(self) -> str:  # follows the server if a restart had to move it to another port
            return self.server.base_url + "/v1" if hasattr(self, "server") else self._base_url

        @base_url.setter
        def base_url(self, value: str) -> None:
            self._base_url = value

        def start(self) -> None:
            self.server.start()
            if self.tokenizer is not None:  # the server's real slot context and its KV shared by all slots
                self.history = HistoryWindow(self.tokenizer, self.server.slot_context, kv_tokens=self.server.ctx_size,
                                             slots=self.server.parallel, session_tokens=self.history_tokens, name=self.name)
                log.info("%s: llama-server slot context %d tokens, %d slots over %d KV tokens: history budget %s",
                         self.name, self.server.slot_context, self.server.parallel, self.server.ctx_size,
                         self.history.describe())
            super().start()

        def stop(self) -> None:
            super().stop()
            self.server.stop()

        def _own_tool_prompt(self, req: GenRequest) -> bool:
            """Tools, or tool messages in the history, for a model whose chat template has no tool support
            (SmolLM2's): llama-server's generic tool format would differ from the built-in engine's, so the
            prompt is rendered here exactly as the built-in engine renders it and sent as a completion."""
            if self.tokenizer is None or req.messages is None or detect_format(self.tokenizer) != "own":
                return False
            has_tool_msgs = any(m.get("role") == "tool" or m.get("tool_calls") for m in req.messages)
            return bool(req.tools and req.tool_choice != "none") or has_tool_msgs

        def request(self, req: GenRequest, request_id: str | None = None) -> tuple[str, dict[str, Any]]:
            path, body = self._request(req)
            if self.logit_bias:
                body["logit_bias"] = self.logit_bias
            if request_id in self._slot_of:
                body["id_slot"] = self._slot_of[request_id][0]
            # its prefill/decode times on every chunk (~150 bytes each): the first token's split of
            # waiting vs computing (async_stream.first_token_timing) is read from the first one
            body["timings_per_token"] = True
            return path, body

        def _take_slot(self, request_id: str, req: GenRequest) -> None:
            """Pick the request's llama-server slot so a short new part goes first in every batch: llama-server
            fills each batch of ``-b`` tokens slot by slot in slot order, so a bystander below a heavy prefill
            gets its prompt and decode tokens into each batch and the prefill takes what is left. A session
            keeps its last slot (its prefix is there) when that keeps the order; otherwise a short request takes
            the lowest free slot, a long one (more than ``heavy_prefill_tokens`` new) the highest — llama-server
            then saves that slot's prompt to its RAM cache and loads this session's from it."""
            ids = self.prompt_ids.pop(request_id, None)
            if ids is None or self.history is None:
                return
            sid = req.session_id
            heavy = self.history.new_tokens(sid, ids) > self.heavy_prefill_tokens
            busy = self._slot_of.values()
            free = sorted(set(range(self.server.parallel)) - set(s for s, _ in busy))
            if not free:
                return  # llama-server queues it for the first slot to free up
            last = self._last_slot.get(sid) if sid else None
            if heavy:
                keep = last in free and all(s < last for s, h in busy if not h)
                slot = last if keep else free[-1]
            else:
                keep = last in free and all(s > last for s, h in busy if h)
                slot = last if keep else free[0]
            self._slot_of[request_id] = (slot, heavy)
            if sid:
                self._last_slot[sid] = slot
                self._last_slot.move_to_end(sid)
                if len(self._last_slot) > 1024:
                    self._last_slot.popitem(last=False)

        def close_session(self, session_id: str) -> None:
            super().close_session(session_id)
            self._last_slot.pop(session_id, None)

        def _request(self, req: GenRequest) -> tuple[str, dict[str, Any]]:
            if not self._own_tool_prompt(req):
                return super().request(req)
            text = render_prompt(self.tokenizer, req.messages, req.tools, req.tool_choice)
            forced = forced_schema(req)
            if forced is not None:
                text += TOOL_OPEN  # the answer is a call: its framing is given, its JSON constrained
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            body = request_body(dataclasses.replace(req, messages=None, prompt_ids=ids, tools=None), self.model, self.dialect)
            if forced is not None:
                body["json_schema"] = forced  # llama-server decodes under the grammar it compiles from this
                # a call's JSON is not a spoken answer: give it room (a cut call is no call at all)
                body["max_tokens"] = max(body["max_tokens"], FORCED_CALL_MAX_TOKENS)
            elif (still := callable_tools(req.tools, req.tool_choice, req.messages)) is not None:
                body["grammar"] = answer_gbnf(still)
            return "/completions", body

        async def generate(self, request_id: str, req: GenRequest) -> AsyncIterator[Delta]:
            if not self.server.alive:  # restarting after a crash: the next answer waits for it, rather than fail
                await asyncio.to_thread(self.server.wait_ready, self.server.ready_timeout_s)
            restarts, pid = self.server.restarts, self.server.proc.pid if self.server.proc else None
            framed = bool(req.tools) and forces_call(req.tool_choice) and self._own_tool_prompt(req)
            self._take_slot(request_id, req)
            try:
                if framed:  # the call's opening was part of the prompt: the parser sees the whole block
                    yield Delta(text=TOOL_OPEN)
                async for d in super().generate(request_id, req):
                    yield d
                if framed:
                    yield Delta(text=TOOL_CLOSE)
            except UpstreamError as exc:
                # a killed process closes its sockets a moment before it can be reaped: look for up to 0.5 s
                for _ in range(10):
                    if self.server.restarts != restarts or not self.server.alive:
                        break
                    await asyncio.sleep(0.05)
                if self.server.restarts != restarts or not self.server.alive:
                    raise UpstreamError(
                        f"the llama.cpp thinker (llama-server pid {pid}) exited mid-answer and is being "
                        f"restarted; this answer is lost, the next one will be served ({exc})",
                        code="engine_crashed",
                    ) from exc
                raise
            finally:
                self._slot_of.pop(request_id, None)

    return LlamaCppScheduler


def create_llama_cpp_scheduler(
    gguf: str | os.PathLike,
    binary: str | os.PathLike,
    *,
    name: str = "thinker",
    threads: int = 1,
    parallel: int = 4,
    ctx_size: int = 8192,
    cache_ram_mib: int = 256,
    batch_tokens: int | None = 16,
    unified_kv: bool = False,
    extra_args: Sequence[str] = (),
    tokenizer: Any = None,
    default_max_tokens: int = 256,
    history_tokens: int | None = None,
    **remote_kwargs: Any,
):
    """A not-yet-started scheduler; ``start()`` launches the server and waits for its health."""
    server = LlamaServer(binary, gguf, threads=threads, parallel=parallel, ctx_size=ctx_size, cache_ram_mib=cache_ram_mib,
                         batch_tokens=batch_tokens, unified_kv=unified_kv, extra_args=extra_args)
    cls = _make_scheduler_class()
    return cls(server, history_tokens=history_tokens, model="omni-rt-thinker", tokenizer=tokenizer, name=name,
               default_max_tokens=default_max_tokens, dialect="llama.cpp", **remote_kwargs)


def _main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m omni_rt.engine.llama_cpp", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["build", "locate"])
    p.add_argument("--root", default=None, help="cache root (default ~/.cache/omni-rt/llama.cpp)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    if a.command == "locate":
        found = locate_binary(a.root)
        print(found or f"not built ({build_failed(a.root) or 'no build yet'}); expected in {build_dir(a.root)}")
        return 0 if found else 1
    t0 = time.monotonic()
    cached = locate_binary(a.root) is not None and not a.force
    if not cached:
        print(f"building llama-server from llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}'s vendored llama.cpp "
              f"(once, a few minutes on 2 cores; log: {build_dir(a.root) / 'build.log'})", flush=True)
    try:
        path = build(a.root, jobs=a.jobs, force=a.force)
    except RuntimeError as exc:
        print(f"warning: {exc}; the CPU thinker falls back to PyTorch", file=sys.stderr)
        return 1
    print(f"llama-server {'cached' if cached else 'built'}: {path} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    raise SystemExit(_main(sys.argv[1:]))
