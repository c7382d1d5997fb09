"""Every HTTP error of a real `omni-rt serve` answers in OpenAI's error shape
(``{"error": {"message", "type", "param", "code"}}``) with a message written for clients; a WebSocket's
``invalid_json`` errors carry no Python decoder text."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
import websockets

pytestmark = pytest.mark.integration

INTERNALS = re.compile(r"Expecting|JSONDecodeError|Traceback|codec can't decode|pydantic|errors\.pydantic|"
                       r"https?://|\{'|detail", re.I)


def assert_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and 0 < len(err["message"]) <= 200, err
    assert err["type"] in ("invalid_request_error", "server_error"), err
    assert code is None or err["code"] == code, err
    assert not INTERNALS.search(err["message"]), err
    return err


def test_http_errors_have_the_openai_shape(live_server):
    with httpx.Client(base_url=live_server.http_url, timeout=10) as http:
        for path in ("/nope", "/v1/models", "/v1/realtime/sessions", "/static/missing.js", "/v1/realtime/calls/x/y"):
            assert_openai_error(http.get(path), 404, "not_found")
        err = assert_openai_error(http.get("/debug/stage_times", params={"after": "soon"}), 400, "invalid_value")
        assert err["param"] == "after" and "integer" in err["message"], err
        assert_openai_error(http.delete("/healthz"), 405, "method_not_allowed")
        assert_openai_error(http.get("/v1/realtime/calls"), 405, "method_not_allowed")
        assert_openai_error(http.put("/metrics"), 405, "method_not_allowed")
        # known paths still answer as before
        assert http.get("/healthz").status_code == 200
        assert http.get("/debug/stage_times", params={"after": 0}).status_code == 200


def test_refused_key_has_the_openai_shape(keyed_server):
    with httpx.Client(base_url=keyed_server.http_url, timeout=10) as http:
        for path in ("/metrics", "/debug/state"):
            assert_openai_error(http.get(path), 401, "invalid_api_key")
        assert_openai_error(http.get("/nope"), 404, "not_found")


async def test_invalid_json_messages_carry_no_decoder_text(live_server):
    async with asyncio.timeout(60):
        async with websockets.connect(f"{live_server.ws_url}/v1/realtime", max_size=None) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            for raw in ("{this is not json", '{"type": "session.update", ', b"\xff\xfe\x00 binary", "[" * 5000 + "]" * 5000,
                        '{"type": "x", "v": NaN'):
                await ws.send(raw)
                while (ev := json.loads(await ws.recv()))["type"] != "error":
                    pass
                err = ev["error"]
                assert err["code"] == "invalid_json", err
                assert not INTERNALS.search(err["message"]) and "char" not in err["message"], err
