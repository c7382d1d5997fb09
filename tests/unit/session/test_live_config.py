"""The GPT-Live session object against openai-python's own schema: every field its ``SessionConfig`` (and
``ResponsesDelegationConfig``) has is known here, honoured or refused by name, and nothing else is accepted."""

import pytest

from omni_rt.realtime.errors import ProtocolError
from omni_rt.realtime.live_config import LiveConfig, parse_responses

openai_live = pytest.importorskip("openai.types.live.session_config")


def test_every_openai_session_field_is_known_and_unknown_ones_are_refused():
    for name in openai_live.SessionConfig.model_fields:
        try:
            LiveConfig.parse({"model": "gpt-live-1", name: None} if name != "model" else {"model": "gpt-live-1"})
        except ProtocolError as exc:  # pragma: no cover - the assertion says which
            pytest.fail(f"session.{name}: {exc.code} {exc.message}")
    with pytest.raises(ProtocolError) as info:
        LiveConfig.parse({"model": "gpt-live-1", "voice": "marin"})
    assert (info.value.code, info.value.param) == ("unknown_parameter", "session.voice")


def test_every_openai_responses_delegation_field_is_honoured_or_refused_by_name():
    from openai.types.live.responses_delegation_config import ResponsesDelegationConfig

    for name in ResponsesDelegationConfig.model_fields:
        try:
            parse_responses({"model": "m", name: None} if name != "model" else {"model": "m"}, "r")
        except ProtocolError as exc:  # pragma: no cover
            pytest.fail(f"responses.{name}: {exc.code} {exc.message}")
    with pytest.raises(ProtocolError) as info:
        parse_responses({"model": "m", "service_tier": "flex"}, "r")
    assert (info.value.code, info.value.param) == ("unsupported_value", "r.service_tier")
