"""Field checks shared by the Realtime and GPT-Live session parsers: both refuse what they do not know by name
(``unknown_parameter`` with the field's dotted ``param``), so a setting is never silently ignored."""

from __future__ import annotations

import math
from typing import Any

from omni_rt.realtime.errors import ProtocolError

MAX_NAME_CHARS = 40  # an unknown key is quoted back at most this long


def is_number(value: Any) -> bool:
    """A finite JSON number (``true`` is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def known_keys(obj: dict[str, Any], allowed: Any, param: str) -> None:
    """Refuse a key ``obj`` does not have in its schema, naming it as ``param.key``."""
    for key in obj:
        if key not in allowed:
            name = f"{param}.{str(key)[:MAX_NAME_CHARS]}"
            raise ProtocolError("unknown_parameter", f"unknown parameter '{name}'", name)


def json_object(value: Any, param: str) -> dict[str, Any]:
    """A JSON object, or ``{}`` for null/absent; anything else is refused naming ``param``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError("invalid_type", f"{param} must be an object", param)
    return value
