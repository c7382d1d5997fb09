"""Experiment 1: fan-out with per-target projection, fan-in merge by source name, dynamic fan-in."""

from __future__ import annotations

import asyncio

import yaml

from omni_rt.pipeline.config import PipelineConfig

try:  # the repo root is on sys.path (python -m pytest / PYTHONPATH=.)
    from tests import toy_stages as toy
except ImportError:  # bare `pytest`: pytest put tests/ itself on sys.path
    import toy_stages as toy  # type: ignore[no-redef]
M, poll_until, running = toy.M, toy.poll_until, toy.running


def _expected(text: str) -> dict:
    return {
        "sources": ["count", "upper"],
        "count": len(text.split()),
        "count_saw": ["delays", "words"],  # projection: count never saw the text
        "upper": text.upper(),
        "upper_saw": ["delays", "text"],  # projection: upper never saw the words
    }


def _strip(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("request_id",)}


async def test_fanout_projection_fanin_two_concurrent_requests_do_not_mix():
    toy.ARRIVALS.clear()
    async with running(toy.fanin_config()) as coord:
        # r1: count first, upper after 0.15 s; r2: its upper queues behind r1's (~0.15 s), its count takes 0.3 s -
        # the two requests' branches reach `join` in opposite orders
        r1 = coord.submit("r1", {"text": "hello omni world", "delays": {"upper": 0.15}})
        r2 = coord.submit("r2", {"text": "stage by stage", "delays": {"count": 0.3}})
        res1, res2 = await asyncio.wait_for(asyncio.gather(r1, r2), 10)
        assert res1["request_id"] == "r1" and res2["request_id"] == "r2"
        assert _strip(res1) == _expected("hello omni world")
        assert _strip(res2) == _expected("stage by stage")
        # the arrival orders really differed, and the merge did not care
        order1 = [b for t, b in toy.ARRIVALS if t == "hello omni world"]
        order2 = [b for t, b in toy.ARRIVALS if t == "stage by stage"]
        assert order1 == ["count", "upper"] and order2 == ["upper", "count"]
        assert await poll_until(lambda: coord.live_total() == 0)
        assert coord.stages["join"].fan_in == {}


async def test_fanin_config_from_yaml_file(tmp_path):
    path = tmp_path / "fanin.yaml"
    path.write_text(yaml.safe_dump(toy.fanin_config()))
    cfg = PipelineConfig.from_file(path)
    assert cfg.stage("split").project_payload["upper"] == f"{M}:project_to_upper"
    async with running(cfg) as coord:
        texts = [f"word{i} " * (i + 1) for i in range(6)]
        results = await asyncio.wait_for(
            asyncio.gather(*(coord.submit(f"y{i}", {"text": t.strip()}) for i, t in enumerate(texts))), 10
        )
        for t, r in zip(texts, results):
            assert _strip(r) == _expected(t.strip())
        assert await poll_until(lambda: coord.live_total() == 0)


def _dynamic_config() -> dict:
    cfg = toy.fanin_config()
    split, _, _, join = cfg["stages"]
    split["route_fn"] = f"{M}:route_by_words"
    join["wait_for_fn"] = f"{M}:wait_for_by_words"
    return cfg


async def test_wait_for_fn_subset_with_route_fn_picking_one_branch():
    async with running(_dynamic_config()) as coord:
        one, many = await asyncio.wait_for(
            asyncio.gather(coord.submit("one", {"text": "hello"}), coord.submit("many", {"text": "hello omni world"})),
            10,
        )
        assert one["sources"] == ["upper"] and one["upper"] == "HELLO" and "count" not in one
        assert _strip(many) == _expected("hello omni world")
        assert await poll_until(lambda: coord.live_total() == 0)


async def test_wait_for_fn_outside_wait_for_fails_request(monkeypatch):
    real = toy.wait_for_by_words
    monkeypatch.setattr(
        toy, "wait_for_by_words", lambda rid, src, p: ["upper", "elsewhere"] if rid == "bad" else real(rid, src, p)
    )
    async with running(_dynamic_config()) as coord:
        try:
            await asyncio.wait_for(coord.submit("bad", {"text": "a b"}), 10)
        except Exception as exc:  # noqa: BLE001
            assert "wait_for_fn" in str(exc) and "elsewhere" in str(exc)
        else:
            raise AssertionError("a wait_for_fn result outside wait_for must fail the request")
        # the pipeline still serves
        assert (await asyncio.wait_for(coord.submit("good", {"text": "hello"}), 10))["upper"] == "HELLO"
        assert await poll_until(lambda: coord.live_total() == 0)


async def test_abort_while_fan_in_is_pending_clears_it_and_drops_late_branch():
    async with running(toy.fanin_config()) as coord:
        join = coord.stages["join"]
        task = asyncio.ensure_future(coord.submit("half", {"text": "a b", "delays": {"upper": 0.3}}))
        assert await poll_until(lambda: "half" in join.fan_in, timeout=3)  # count arrived, upper has not
        assert set(join.fan_in["half"].inputs) == {"count"}
        coord.abort("half")
        assert join.fan_in == {}
        try:
            await asyncio.wait_for(task, 5)
        except Exception as exc:  # noqa: BLE001
            assert getattr(exc, "code", None) == "aborted"
        else:
            raise AssertionError("an aborted request must not complete")
        # upper finishes later: its output is dropped at upper's shell, nothing is re-created in join
        assert await poll_until(lambda: coord.stages["upper"].dropped_outputs == 1, timeout=3)
        assert join.fan_in == {} and coord.live_total() == 0


async def test_merge_fn_failure_fails_request_in_the_fan_in_stage(monkeypatch):
    def bad_merge(request_id, inputs):
        raise KeyError("no such field")

    monkeypatch.setattr(toy, "merge", bad_merge)
    async with running(toy.fanin_config()) as coord:
        try:
            await asyncio.wait_for(coord.submit("m", {"text": "a b"}), 5)
        except Exception as exc:  # noqa: BLE001
            assert getattr(exc, "stage", None) == "join", (getattr(exc, "stage", None), str(exc))
            assert "no such field" in str(exc)
        else:
            raise AssertionError("a failing merge_fn must fail the request")
        assert await poll_until(lambda: coord.live_total() == 0), coord.live_state()


async def test_stop_fails_in_flight_requests_with_shutdown():
    async with running(toy.fanin_config()) as coord:
        task = asyncio.ensure_future(coord.submit("slow", {"text": "a", "delays": {"upper": 0.3}}))
        assert await poll_until(lambda: coord.live_state()["requests"] == 1)
        await coord.stop()
        try:
            await asyncio.wait_for(task, 5)
        except Exception as exc:  # noqa: BLE001
            assert getattr(exc, "code", None) == "shutdown"
        else:
            raise AssertionError("stop() must fail in-flight requests")
        await coord.start()  # running() stops it again on exit
