"""The server reads stage roles from the pipeline config, never stage names: rename every stage of the CPU
preset and the same spoken and text turns still work end to end."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import websockets
import yaml
from servers import ROOT, start_server, stop_server
from rt_helpers import pcm_chunks_b64, speech_with_silence, validate_event


RENAMES = {"asr": "ears", "thinker": "brain", "talker": "mouth", "vocoder": "voice"}


def renamed_preset() -> dict:
    data = yaml.safe_load((ROOT / "models" / "cpu.yaml").read_text())
    data["name"] = "cpu-renamed"
    data["entry"] = RENAMES[data["entry"]]
    data["roles"] = {role: RENAMES[stage] for role, stage in data["roles"].items()}
    for st in data["stages"]:
        st["name"] = RENAMES[st["name"]]
        for key in ("next", "stream_to"):
            if key in st:
                st[key] = RENAMES[st[key]] if isinstance(st[key], str) else [RENAMES[t] for t in st[key]]
    return data


@pytest.fixture(scope="module")
def renamed_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("renamed")
    path = tmp / "renamed.yaml"
    path.write_text(yaml.safe_dump(renamed_preset(), sort_keys=False))
    server = start_server(tmp, "--preset", str(path), "--max-sessions", "2")
    yield server
    stop_server(server)


async def test_renamed_stages_serve_spoken_and_text_turns(renamed_server, speech_samples):
    audio, sr, _ = speech_samples["capital"]
    async with asyncio.timeout(120), websockets.connect(f"{renamed_server.ws_url}/v1/realtime", max_size=None) as ws:
        async def until(etype: str) -> list[dict]:
            seen = []
            while True:
                event = json.loads(await ws.recv())
                validate_event(event)
                seen.append(event)
                assert event["type"] != "error", event
                if event["type"] == etype:
                    return seen

        await until("session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": None, "transcription": {"model": "whisper-1"}}}}}))
        await until("session.updated")
        for chunk in pcm_chunks_b64(speech_with_silence(audio, sr, lead_s=0.1, tail_s=0.3)):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        heard = (await until("conversation.item.input_audio_transcription.completed"))[-1]["transcript"]
        assert "capital" in heard.lower(), heard
        await ws.send(json.dumps({"type": "response.create"}))
        events = await until("response.done")
        done = events[-1]["response"]
        assert done["status"] == "completed", done
        audio_out = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
        transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        assert len(audio_out) > 24000 and transcript.strip(), (len(audio_out), transcript)
    assert renamed_server.wait_idle(timeout=30)["total"] == 0
