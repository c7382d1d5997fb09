"""SessionScheduler through the coordinator: open / append / commit / close, limits, idle expiry."""

from __future__ import annotations

import asyncio

from omni_rt.contracts.payloads import AsrError, SessionExpired
from omni_rt.pipeline.messages import IncomingMessage

try:  # the repo root is on sys.path (python -m pytest / PYTHONPATH=.)
    from tests import toy_stages as toy
except ImportError:  # bare `pytest`: pytest put tests/ itself on sys.path
    import toy_stages as toy  # type: ignore[no-redef]
poll_until, running = toy.poll_until, toy.running


def as_dict(event) -> dict:
    """The toy stage's own events are dicts; an error on the session (the coordinator's) and an expiry (the
    session scheduler's) are contract types."""
    if isinstance(event, AsrError):
        return {"type": "error", "code": event.code, "message": event.message}
    if isinstance(event, SessionExpired):
        return {"type": "session.expired", "idle_s": event.idle_s}
    return event


class Listener:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def __call__(self, stage: str, event) -> None:
        self.events.append((stage, as_dict(event)))

    def types(self) -> list[str]:
        return [e["type"] for _, e in self.events]

    def of(self, type_: str) -> list[dict]:
        return [e for _, e in self.events if e["type"] == type_]


async def test_open_append_commit_close():
    async with running(toy.session_config()) as coord:
        lis = Listener()
        coord.open_session("s1", "asr", {"lang": "en"}, lis)
        assert await poll_until(lambda: "session.opened" in lis.types())
        assert lis.events[0] == ("asr", {"type": "session.opened", "params": {"lang": "en"}})
        for chunk in (b"abc", b"de", b"f"):
            coord.append("s1", "asr", chunk)
        assert await poll_until(lambda: len(lis.of("appended")) == 3)
        assert [e["size"] for e in lis.of("appended")] == [3, 5, 6]
        coord.session_control("s1", "asr", "commit")
        assert await poll_until(lambda: lis.of("committed"))
        assert lis.of("committed")[0]["audio"] == b"abcdef"
        # next turn: the buffer starts empty, the session's state lives on
        coord.append("s1", "asr", b"xy")
        coord.session_control("s1", "asr", "commit")
        assert await poll_until(lambda: len(lis.of("committed")) == 2)
        assert lis.of("committed")[1]["audio"] == b"xy"
        assert coord.stages["asr"].scheduler.live_state() == 1
        # an unknown op is an error event for the session, which lives on
        coord.session_control("s1", "asr", "dance")
        assert await poll_until(lambda: lis.of("error"))
        assert "dance" in lis.of("error")[0]["message"]
        coord.append("s1", "asr", b"z")
        assert await poll_until(lambda: lis.of("appended")[-1]["size"] == 1)
        coord.close_session("s1")
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()
        # the id can be opened again
        lis2 = Listener()
        coord.open_session("s1", "asr", {}, lis2)
        assert await poll_until(lambda: "session.opened" in lis2.types())
        coord.close_session("s1")
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()


async def test_max_sessions_limit():
    async with running(toy.session_config(max_sessions=2)) as coord:
        ls = {sid: Listener() for sid in ("a", "b", "c")}
        for sid, lis in ls.items():
            coord.open_session(sid, "asr", {}, lis)
        assert await poll_until(lambda: ls["c"].of("error"))
        err = ls["c"].of("error")[0]
        assert err["code"] == "session_limit" and "limit 2" in err["message"]
        assert "session.opened" in ls["a"].types() and "session.opened" in ls["b"].types()
        assert coord.stages["asr"].scheduler.live_state() == 2
        # appends to the refused session fail clearly; the open ones are untouched
        coord.append("c", "asr", b"x")
        assert await poll_until(lambda: len(ls["c"].of("error")) == 2)
        assert ls["c"].of("error")[1]["code"] == "session_not_found"
        coord.close_session("c")
        coord.close_session("a")
        # a slot is free again
        ls["d"] = Listener()
        coord.open_session("d", "asr", {}, ls["d"])
        assert await poll_until(lambda: "session.opened" in ls["d"].types())
        for sid in ("b", "d"):
            coord.close_session(sid)
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()


async def test_buffer_full_rejects_append_and_session_lives_on():
    async with running(toy.session_config(max_buffered_bytes=10)) as coord:
        lis = Listener()
        coord.open_session("s", "asr", {}, lis)
        coord.append("s", "asr", b"123456")
        coord.append("s", "asr", b"abcdef")  # 12 > 10: refused, not applied
        coord.append("s", "asr", b"7890")  # exactly 10: fine
        assert await poll_until(lambda: lis.of("error") and len(lis.of("appended")) == 2)
        err = lis.of("error")[0]
        assert err["code"] == "buffer_full" and "10 bytes" in err["message"]
        coord.session_control("s", "asr", "commit")
        assert await poll_until(lambda: lis.of("committed"))
        assert lis.of("committed")[0]["audio"] == b"1234567890"
        # after the commit the buffer is free again
        coord.append("s", "asr", b"abcdef")
        assert await poll_until(lambda: len(lis.of("appended")) == 3)
        assert len(lis.of("error")) == 1
        coord.close_session("s")
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()


async def test_idle_timeout_expires_session():
    async with running(toy.session_config(idle_timeout_s=0.2)) as coord:
        lis, busy = Listener(), Listener()
        coord.open_session("idle", "asr", {}, lis)
        coord.open_session("busy", "asr", {}, busy)
        sched = coord.stages["asr"].scheduler
        # keep one session busy while the other idles out (the sweep runs about once a second)
        for _ in range(100):
            coord.append("busy", "asr", b"x")
            if lis.of("session.expired"):
                break
            await asyncio.sleep(0.03)
        assert lis.of("session.expired"), "an idle session must expire within about a second of its timeout"
        assert lis.of("session.expired")[0]["idle_s"] >= 0.2
        assert "session.expired" not in busy.types()
        assert sched.live_state() == 1 and "idle" not in sched.sessions
        # the expired session is gone: an append to it fails clearly
        coord.append("idle", "asr", b"x")
        assert await poll_until(lambda: lis.of("error"))
        assert lis.of("error")[0]["code"] == "session_not_found"
        coord.close_session("idle")
        coord.close_session("busy")
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()


def test_session_scheduler_direct_close_via_stream_done():
    sched = toy.create_session()
    sched.start()
    try:
        sched.inbox.put(IncomingMessage("s", "new_request", {"op": "open"}))
        sched.inbox.put(IncomingMessage("s", "new_request", {"op": "open"}))  # twice: error, first one lives
        sched.inbox.put(IncomingMessage("s", "stream_chunk", b"ab", "client"))
        sched.inbox.put(IncomingMessage("s", "stream_done", None, "client"))
        outs = toy.drain(sched.outbox, 0.2)
        kinds = [(o.type, o.data["type"] if isinstance(o.data, dict) else o.metadata.get("code")) for o in outs]
        assert kinds == [("event", "session.opened"), ("error", "session_exists"), ("event", "appended"),
                         ("result", "session.closed")]
        assert sched.live_state() == 0
    finally:
        sched.stop()
