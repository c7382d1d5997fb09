"""Client-facing errors: a refused client event becomes an ``error`` event and the session lives on."""

from __future__ import annotations

from typing import Any


class ProtocolError(Exception):
    """A client event we refuse. ``param`` names the offending field (``session.audio.output.voice``)."""

    def __init__(self, code: str, message: str, param: str | None = None, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.type = type_


def error_event(code: str, message: str, param: str | None = None, event_id: str | None = None,
                type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "code": code, "message": message, "param": param, "event_id": event_id}}


# What a client is told when its answer fails in the pipeline, by the stage's error code. The stage's own message
# (engine addresses, upstream bodies, exception text) goes to the log only: it means nothing to a client and may
# name internals.
FAILURE_MESSAGES: dict[str, str] = {
    "context_length_exceeded": "the conversation is too long for the model's context; delete some items or start a new session",
    "engine_crashed": "the model engine stopped mid-answer and is being restarted; this answer is lost, send response.create to retry",
    "upstream_unavailable": "the model engine cannot be reached right now; try again shortly",
    "upstream_timeout": "the model engine stopped producing output; try again",
    "upstream_http_error": "the model engine refused the request",
    "upstream_error": "the model engine failed while answering",
    "shutdown": "the server is shutting down",
    "server_error": "the server failed while answering",
    "bad_request": "the answer's request was not valid for the model engine",
}


def failure_message(code: str, stage: str) -> str:
    """A short client-facing message for a response that failed with ``code`` in ``stage``."""
    return FAILURE_MESSAGES.get(code, f"the answer failed in the '{stage}' stage ({code})")
