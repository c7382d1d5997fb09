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
