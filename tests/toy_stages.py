"""Toy stages for the runtime-core tests (recreating the three SGLang-Omni stage/scheduler experiments).

Everything here is referenced from pipeline configs by import path (``tests.toy_stages:<name>``), so the
tests exercise the real config loader, routing compiler and coordinator. Payloads are plain dicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from typing import Any, AsyncIterator, Callable

from omni_rt.pipeline.config import PipelineConfig
from omni_rt.pipeline.coordinator import Coordinator
from omni_rt.pipeline.schedulers.base import ThreadedScheduler
from omni_rt.pipeline.schedulers.session import Session, SessionScheduler
from omni_rt.pipeline.schedulers.simple import SimpleScheduler
from omni_rt.pipeline.schedulers.streaming import StreamingSimpleScheduler, StreamState

M = __name__  # "tests.toy_stages", or "toy_stages" when pytest put tests/ on sys.path


# ---- helpers used by the tests ----------------------------------------------------------------------
@contextlib.asynccontextmanager
async def running(config: PipelineConfig | dict, **kwargs: Any) -> AsyncIterator[Coordinator]:
    """Build a coordinator from a config (or a plain dict, validated by the real loader), start, stop."""
    cfg = config if isinstance(config, PipelineConfig) else PipelineConfig.model_validate(config)
    coord = Coordinator(cfg, **kwargs)
    await coord.start()
    try:
        yield coord
    finally:
        await coord.stop()


async def poll_until(cond: Callable[[], bool], timeout: float = 3.0, interval: float = 0.01) -> bool:
    """Await until ``cond()`` is true (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)


def stage(name: str, factory: str, **kw: Any) -> dict[str, Any]:
    """A stage dict with the factory given relative to this module."""
    return {"name": name, "factory": f"{M}:{factory}", **kw}


# ---- experiment 1: fan-out with projection, fan-in merge ----------------------------------------------
def _sleep_for(payload: dict, key: str) -> None:
    delay = (payload.get("delays") or {}).get(key, 0.0)
    if delay:
        time.sleep(delay)


def create_split() -> SimpleScheduler:
    def fn(payload: dict) -> dict:
        text = payload["text"]
        return {"text": text, "words": text.split(), "delays": payload.get("delays") or {}}

    return SimpleScheduler(fn, name="split")


def project_to_upper(request_id: str, result: dict) -> dict:
    """upper needs only the text (and its test-only delay)."""
    return {"text": result["text"], "delays": result["delays"]}


def project_to_count(request_id: str, result: dict) -> dict:
    """count needs only the words (and its test-only delay)."""
    return {"words": list(result["words"]), "delays": result["delays"]}


ARRIVALS: list[tuple[str, str]] = []  # (request text, branch) in the order branches finished
_ARRIVALS_LOCK = threading.Lock()


def create_upper() -> SimpleScheduler:
    def fn(payload: dict) -> dict:
        _sleep_for(payload, "upper")
        out = {"upper": payload["text"].upper(), "upper_saw": sorted(payload), "n_words": len(payload["text"].split())}
        with _ARRIVALS_LOCK:
            ARRIVALS.append((payload["text"], "upper"))
        return out

    return SimpleScheduler(fn, name="upper")


def create_count() -> SimpleScheduler:
    def fn(payload: dict) -> dict:
        _sleep_for(payload, "count")
        out = {"count": len(payload["words"]), "count_saw": sorted(payload), "n_words": len(payload["words"])}
        with _ARRIVALS_LOCK:
            ARRIVALS.append((" ".join(payload["words"]), "count"))
        return out

    return SimpleScheduler(fn, name="count")


def merge(request_id: str, inputs: dict[str, dict]) -> dict:
    """Merge by source name, never by arrival (dict) order."""
    data: dict[str, Any] = {"sources": sorted(inputs), "request_id": request_id}
    for name in sorted(inputs):
        data.update(inputs[name])
    data.pop("n_words", None)
    return data


def create_join() -> SimpleScheduler:
    return SimpleScheduler(lambda payload: payload, name="join")


def route_by_words(request_id: str, result: dict) -> list[str]:
    """A one-word text only needs `upper`; longer texts go to both branches."""
    return ["upper"] if len(result["words"]) == 1 else ["upper", "count"]


def wait_for_by_words(request_id: str, source: str, payload: dict) -> list[str]:
    """Must agree with ``route_by_words``: the first arriving branch says how many words there were."""
    return ["upper"] if payload["n_words"] == 1 else ["upper", "count"]


def route_outside_next(request_id: str, result: Any) -> str:
    return "nowhere"


def identity(payload: Any) -> Any:
    return payload


def create_identity() -> SimpleScheduler:
    return SimpleScheduler(identity, name="identity")


def fanin_config(**overrides: Any) -> dict[str, Any]:
    """split -> (upper, count) with projections -> join (wait_for + merge_fn)."""
    cfg = {
        "name": "fanin",
        "entry": "split",
        "stages": [
            stage("split", "create_split", next=["upper", "count"],
                  project_payload={"upper": f"{M}:project_to_upper", "count": f"{M}:project_to_count"}),
            stage("upper", "create_upper", next="join"),
            stage("count", "create_count", next="join"),
            stage("join", "create_join", wait_for=["upper", "count"], merge_fn=f"{M}:merge", terminal=True),
        ],
    }
    cfg.update(overrides)
    return cfg


# ---- experiment 2: batching window ----------------------------------------------------------------
def create_encoder(max_batch_wait_ms: float = 200, batch_wait_when_idle: bool = False,
                   max_batch_size: int = 8) -> SimpleScheduler:
    def one(payload: Any) -> dict:
        return {"batch_size": 1, "x": payload}

    def batch(payloads: list[Any]) -> list[dict]:
        return [{"batch_size": len(payloads), "x": p} for p in payloads]

    return SimpleScheduler(one, batch_compute_fn=batch, max_batch_size=max_batch_size,
                           max_batch_wait_ms=max_batch_wait_ms, batch_wait_when_idle=batch_wait_when_idle,
                           name="encoder")


# ---- experiment 3: a talker streaming codes to a vocoder -------------------------------------------
class ToyTalker(ThreadedScheduler):
    """Emits ``steps`` code chunks (one per "decode step"), then its result.

    Payload keys (all optional): ``steps`` (3), ``step_delay`` (s between steps), ``start_delay`` (s before
    the first step), ``tail_delay`` (s between the last chunk and the result), ``fail_at`` (copied into
    every chunk so a vocoder can fail on that step). With ``honor_abort=False`` it keeps generating after
    an abort, to check that the shell drops late outputs.
    """

    def __init__(self, honor_abort: bool = True, name: str = "talker") -> None:
        super().__init__()
        self.name = name
        self.honor_abort = honor_abort
        self._aborted: set[str] = set()
        self._current: str | None = None
        self._lock = threading.Lock()
        self.emitted_after_abort = 0

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborted.add(request_id)
        super().abort(request_id)

    def live_state(self) -> int:
        with self._lock:
            return int(self._current is not None and self._current not in self._aborted)

    def _is_aborted(self, rid: str) -> bool:
        with self._lock:
            return rid in self._aborted

    def run_loop(self) -> None:
        while self.running:
            msg = self.inbox.get()
            if msg.type != "new_request":
                continue
            rid, p = msg.request_id, (msg.data or {})
            with self._lock:
                if self.honor_abort and rid in self._aborted:  # aborted while still queued
                    self._aborted.discard(rid)
                    continue
                self._current = rid
            try:
                self._generate(rid, p)
            finally:
                with self._lock:
                    self._current = None
                    self._aborted.discard(rid)

    def _generate(self, rid: str, p: dict) -> None:
        steps = int(p.get("steps", 3))
        time.sleep(p.get("start_delay", 0.0))
        for step in range(steps):
            if step and p.get("step_delay"):
                time.sleep(p["step_delay"])
            if not self.running:
                return
            if self._is_aborted(rid):
                if self.honor_abort:
                    return
                self.emitted_after_abort += 1
            self.emit(rid, "stream", {"codes": [step * 10 + 1, step * 10 + 2], "step": step,
                                      "fail_at": p.get("fail_at")}, step=step)
        time.sleep(p.get("tail_delay", 0.0))
        if self._is_aborted(rid):
            if self.honor_abort:
                return
            self.emitted_after_abort += 1
        self.emit(rid, "result", {"num_steps": steps, "text": p.get("text")})


def create_talker(honor_abort: bool = True) -> ToyTalker:
    return ToyTalker(honor_abort=honor_abort)


class ToyVocoder(StreamingSimpleScheduler):
    """"Decodes" each code chunk into samples (code * 100) as it arrives and streams them out.

    Keeps the order in which it saw payload / chunks / stream_done per request (``state.user['order']``,
    copied into the result and into ``self.orders``), so tests can check every ordering.
    """

    def __init__(self, decode_delay: float = 0.0, name: str = "vocoder") -> None:
        super().__init__(name=name)
        self.decode_delay = decode_delay
        self.orders: dict[str, list[str]] = {}
        self.aborted_states = 0

    def _log(self, rid: str, state: StreamState, what: str) -> None:
        state.user.setdefault("order", []).append(what)
        self.orders[rid] = list(state.user["order"])

    def on_payload(self, request_id: str, state: StreamState) -> None:
        self._log(request_id, state, "payload")

    def on_stream_chunk(self, request_id: str, state: StreamState, data: Any, source: str | None) -> None:
        if self.decode_delay:
            time.sleep(self.decode_delay)
        if data.get("fail_at") is not None and data["step"] == data["fail_at"]:
            raise RuntimeError(f"cannot decode step {data['step']}")
        samples = [c * 100 for c in data["codes"]]
        state.user.setdefault("samples", []).extend(samples)
        self._log(request_id, state, f"chunk{data['step']}")
        self.emit(request_id, "stream", {"samples": samples, "step": data["step"]}, modality="audio")

    def on_stream_done(self, request_id: str, state: StreamState, source: str | None) -> None:
        self._log(request_id, state, f"done:{source}")

    def on_complete(self, request_id: str, state: StreamState) -> None:
        self._log(request_id, state, "complete")
        self.emit(request_id, "result", {"total_samples": len(state.user.get("samples", [])),
                                         "payload": state.payload, "order": list(state.user["order"])})

    def on_abort(self, request_id: str, state: StreamState) -> None:
        self.aborted_states += 1


def create_vocoder(decode_delay: float = 0.0) -> ToyVocoder:
    return ToyVocoder(decode_delay=decode_delay)


def stream_config(can_accept_stream_before_payload: bool = True, vocoder_args: dict | None = None,
                  talker_args: dict | None = None) -> dict[str, Any]:
    """talker --stream_to--> vocoder (terminal); talker's result is vocoder's payload."""
    return {
        "name": "stream",
        "entry": "talker",
        "stages": [
            stage("talker", "create_talker", args=talker_args or {}, next="vocoder", stream_to=["vocoder"]),
            stage("vocoder", "create_vocoder", args=vocoder_args or {}, terminal=True,
                  can_accept_stream_before_payload=can_accept_stream_before_payload),
        ],
    }


def create_delay() -> SimpleScheduler:
    """Passes the payload on after ``payload['payload_delay']`` seconds (a slow payload path)."""
    def fn(payload: dict) -> dict:
        time.sleep(payload.get("payload_delay", 0.0))
        return {"via": "delay", "text": payload.get("text")}

    return SimpleScheduler(fn, name="delay")


def merge_sink(request_id: str, inputs: dict[str, Any]) -> dict:
    return {"talker": inputs["talker"], "vocoder": inputs["vocoder"]}


def two_path_config(can_accept_stream_before_payload: bool = True) -> dict[str, Any]:
    """entry -> (talker, delay); talker streams to vocoder, delay carries vocoder's payload; both -> sink.

    The payload and the stream reach the vocoder by different paths, so their order is set by the delays in
    the request: ``start_delay`` (talker) vs ``payload_delay`` (delay stage).
    """
    return {
        "name": "two_path",
        "entry": "entry",
        "stages": [
            stage("entry", "create_identity", next=["talker", "delay"]),
            stage("talker", "create_talker", next="sink", stream_to="vocoder"),
            stage("delay", "create_delay", next="vocoder"),
            stage("vocoder", "create_vocoder", next="sink", client_stream=True,
                  can_accept_stream_before_payload=can_accept_stream_before_payload),
            stage("sink", "create_join", wait_for=["talker", "vocoder"], merge_fn=f"{M}:merge_sink", terminal=True),
        ],
    }


# ---- failures ------------------------------------------------------------------------------------
def create_flaky() -> SimpleScheduler:
    def fn(payload: dict) -> dict:
        time.sleep(payload.get("sleep", 0.0))
        if payload.get("fail"):
            raise ValueError(f"boom on {payload['id']}")
        return {"ok": payload["id"]}

    return SimpleScheduler(fn, name="flaky")


# ---- sessions ------------------------------------------------------------------------------------
class ToySession(SessionScheduler):
    """Buffers appended bytes, emits an event per append, hands the buffer out and resets it on ``commit``."""

    def on_open(self, session: Session) -> None:
        session.state["buf"] = bytearray()
        self.emit(session.session_id, "event", {"type": "session.opened", "params": session.params})

    def on_append(self, session: Session, data: Any) -> None:
        session.state["buf"] += data
        self.emit(session.session_id, "event", {"type": "appended", "size": len(session.state["buf"])})

    def on_control(self, session: Session, op: str, data: dict[str, Any]) -> None:
        if op != "commit":
            raise ValueError(f"unknown session op '{op}'")
        buf = bytes(session.state["buf"])
        session.state["buf"] = bytearray()
        session.buffered_bytes = 0
        self.emit(session.session_id, "event", {"type": "committed", "audio": buf})

    def on_close(self, session: Session) -> None:
        session.state.clear()


def create_session(max_sessions: int = 64, max_buffered_bytes: int = 1 << 20,
                   idle_timeout_s: float = 600.0) -> ToySession:
    return ToySession(max_sessions=max_sessions, max_buffered_bytes=max_buffered_bytes,
                      idle_timeout_s=idle_timeout_s, name="asr")


def session_config(**args: Any) -> dict[str, Any]:
    return {
        "name": "sessions",
        "entry": "asr",
        "stages": [stage("asr", "create_session", args=args, terminal=True, can_accept_stream_before_payload=True)],
    }


def drain(q: "queue.Queue", timeout: float = 0.5) -> list:
    """Everything a queue yields until it stays empty for ``timeout`` seconds."""
    out = []
    while True:
        try:
            out.append(q.get(timeout=timeout))
        except queue.Empty:
            return out
