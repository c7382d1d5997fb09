"""WebRTC signalling: reading and checking the SDP offer of ``POST /v1/realtime/calls``.

Split from ``webrtc.py`` (the call and its registry): the body formats the route accepts (raw SDP, multipart as
openai-python sends it, JSON), their limits, and the refusals (``CallError``: HTTP status + OpenAI-style body).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DATA_CHANNEL = "oai-events"
MAX_SDP_BYTES = 64 * 1024
MAX_SESSION_BYTES = 256 * 1024


@dataclass
class CallError(Exception):
    """A refused call: the HTTP status and an OpenAI-style error body."""

    status: int
    code: str
    message: str
    param: str | None = None
    type: str = "invalid_request_error"
    retry_after: str | None = None  # seconds, for a ``Retry-After`` header (429 and 503 of the pending pool)

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.type, "code": self.code, "message": self.message, "param": self.param}}

    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": self.retry_after} if self.retry_after else None


# ---- the offer ---------------------------------------------------------------------------------------------
async def read_offer(request: Any) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and optional session config of a ``POST /v1/realtime/calls`` body: raw ``application/sdp``,
    multipart ``sdp`` + ``session`` (openai-python's ``calls.create``), or JSON ``{sdp, session}``."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    session: Any = None
    if ctype == "multipart/form-data":
        try:
            form = await request.form(max_files=4, max_fields=8)
        except Exception:  # starlette raises several kinds on a broken multipart body
            raise CallError(400, "invalid_request", "could not parse the multipart body") from None
        sdp, session = await _form_text(form.get("sdp")), await _form_text(form.get("session"))
    else:
        raw = await request.body()
        if len(raw) > MAX_SDP_BYTES + MAX_SESSION_BYTES:
            raise CallError(413, "request_too_large", f"the body is over {MAX_SDP_BYTES + MAX_SESSION_BYTES} bytes")
        text = raw.decode("utf-8", errors="replace")
        if ctype == "application/json":
            try:
                body = json.loads(text)
            except (ValueError, RecursionError):
                raise CallError(400, "invalid_json", "the body is not valid JSON") from None
            if not isinstance(body, dict):
                raise CallError(400, "invalid_json", "the JSON body must be an object with 'sdp' (and 'session')")
            sdp, session = body.get("sdp"), body.get("session")
        else:  # application/sdp, and what browsers send when the type is left out
            sdp = text
    if not isinstance(sdp, str) or not sdp.strip():
        raise CallError(400, "missing_required_parameter", "the body needs an SDP offer", "sdp")
    if len(sdp) > MAX_SDP_BYTES:
        raise CallError(413, "request_too_large", f"the SDP offer is over {MAX_SDP_BYTES} bytes", "sdp")
    if isinstance(session, str):
        if len(session) > MAX_SESSION_BYTES:
            raise CallError(413, "request_too_large", f"the session is over {MAX_SESSION_BYTES} bytes", "session")
        try:
            session = json.loads(session) if session.strip() else None
        except (ValueError, RecursionError):
            raise CallError(400, "invalid_json", "'session' is not valid JSON", "session") from None
    if session is not None and not isinstance(session, dict):
        raise CallError(400, "invalid_type", "'session' must be a JSON object", "session")
    return sdp, session


async def _form_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    data = await value.read(MAX_SDP_BYTES + MAX_SESSION_BYTES + 1)  # an UploadFile (a part with a filename)
    if len(data) > MAX_SDP_BYTES + MAX_SESSION_BYTES:
        raise CallError(413, "request_too_large", "a multipart part is too large")
    return data.decode("utf-8", errors="replace")


def check_offer(sdp: str) -> None:
    """Refuse, with a clear reason, an offer this server cannot answer: not SDP, no audio, no data channel."""
    from aiortc.sdp import SessionDescription

    if not sdp.lstrip().startswith("v=0"):
        raise CallError(400, "invalid_offer", "the body is not an SDP offer (it must start with 'v=0')", "sdp")
    try:
        desc = SessionDescription.parse(sdp)
    except Exception:
        raise CallError(400, "invalid_offer", "the SDP offer could not be parsed", "sdp") from None
    kinds = [m.kind for m in desc.media]
    if "audio" not in kinds:
        raise CallError(400, "invalid_offer", "the offer has no audio section (m=audio): add a microphone track "
                        "or an audio transceiver", "sdp")
    if "application" not in kinds:
        raise CallError(400, "invalid_offer", f"the offer has no data channel (m=application): create the "
                        f"'{DATA_CHANNEL}' data channel before createOffer()", "sdp")
    if not any(c.mimeType.lower() == "audio/opus" for m in desc.media if m.kind == "audio" for c in m.rtp.codecs):
        raise CallError(400, "invalid_offer", "the offer's audio does not include Opus", "sdp")
