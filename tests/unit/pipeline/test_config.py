"""Config validation: every error names the stage and the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from omni_rt.pipeline.config import ConfigError, PipelineConfig
from omni_rt.pipeline.coordinator import Coordinator

try:  # the repo root is on sys.path (python -m pytest / PYTHONPATH=.)
    from tests import toy_stages as toy
except ImportError:  # bare `pytest`: pytest put tests/ itself on sys.path
    import toy_stages as toy  # type: ignore[no-redef]
M, stage = toy.M, toy.stage


def _config_error(exc: BaseException) -> ConfigError:
    """The ConfigError itself, or the one pydantic wrapped (graph checks run in a model validator)."""
    if isinstance(exc, ConfigError):
        return exc
    assert isinstance(exc, ValidationError), exc
    return exc.errors()[0]["ctx"]["error"]


def _assert_names(exc_info, stage_name: str, field: str, *words: str) -> None:
    err = _config_error(exc_info.value)
    assert isinstance(err, ConfigError)
    assert (err.stage, err.field) == (stage_name, field), str(err)
    text = str(exc_info.value)
    assert f"stage '{stage_name}'" in text and f"field '{field}'" in text, text
    for w in words:
        assert w in text, text


def test_unknown_stage_in_next():
    cfg = {"entry": "a", "stages": [stage("a", "create_identity", next="ghost"),
                                    stage("b", "create_identity", terminal=True)]}
    with pytest.raises((ConfigError, ValidationError)) as info:
        PipelineConfig.model_validate(cfg)
    _assert_names(info, "a", "next", "ghost")


def test_unknown_stream_to_target():
    cfg = {"entry": "a", "stages": [stage("a", "create_identity", next="b", stream_to="ghost"),
                                    stage("b", "create_identity", terminal=True)]}
    with pytest.raises((ConfigError, ValidationError)) as info:
        PipelineConfig.model_validate(cfg)
    _assert_names(info, "a", "stream_to", "ghost")


def test_cycle_without_terminal():
    cfg = {"entry": "a", "stages": [stage("a", "create_identity", next="b"),
                                    stage("b", "create_identity", next="a")]}
    with pytest.raises((ConfigError, ValidationError)) as info:
        PipelineConfig.model_validate(cfg)
    _assert_names(info, "a", "next", "terminal")


def test_cycle_beside_a_terminal_is_still_an_error():
    cfg = {"entry": "a", "stages": [stage("a", "create_identity", next=["b", "t"]),
                                    stage("b", "create_identity", next="c"),
                                    stage("c", "create_identity", next="b"),
                                    stage("t", "create_identity", terminal=True)]}
    with pytest.raises((ConfigError, ValidationError)) as info:
        PipelineConfig.model_validate(cfg)
    _assert_names(info, "b", "next", "terminal")


def test_project_payload_target_not_in_next():
    cfg = toy.fanin_config()
    cfg["stages"][0]["project_payload"]["join"] = f"{M}:project_to_upper"
    with pytest.raises((ConfigError, ValidationError)) as info:
        PipelineConfig.model_validate(cfg)
    _assert_names(info, "split", "project_payload", "join")


def test_unknown_field_is_rejected():
    cfg = {"entry": "a", "stages": [stage("a", "create_identity", terminal=True, nxt="b")]}
    with pytest.raises(ValidationError) as info:
        PipelineConfig.model_validate(cfg)
    assert "nxt" in str(info.value)


@pytest.mark.parametrize(
    "field,stage_idx,value",
    [
        ("route_fn", 0, f"{M}:no_such_route"),
        ("factory", 1, f"{M}:no_such_factory"),
        ("factory", 2, "no_such_module_xyz.sub:create"),
        ("merge_fn", 3, f"{M}:no_such_merge"),
        ("wait_for_fn", 3, f"{M}:no_such_wait_for"),
        ("project_payload", 0, None),
    ],
)
def test_not_importable_raises_at_coordinator_build(field, stage_idx, value):
    cfg = toy.fanin_config()
    st = cfg["stages"][stage_idx]
    if field == "project_payload":
        st["project_payload"]["upper"] = f"{M}:no_such_projection"
        value = f"{M}:no_such_projection"
    else:
        st[field] = value
    config = PipelineConfig.model_validate(cfg)  # imports are resolved when the pipeline is built
    with pytest.raises(ConfigError) as info:
        Coordinator(config)
    _assert_names(info, st["name"], field, value)


def test_not_callable_names_stage_and_field():
    cfg = toy.fanin_config()
    cfg["stages"][3]["merge_fn"] = f"{M}:ARRIVALS"
    with pytest.raises(ConfigError) as info:
        Coordinator(PipelineConfig.model_validate(cfg))
    _assert_names(info, "join", "merge_fn", "not callable")


def test_factory_rejecting_args_names_stage_and_field():
    cfg = {"entry": "a", "stages": [stage("a", "create_identity", terminal=True, args={"bogus": 1})]}
    with pytest.raises(ConfigError) as info:
        Coordinator(PipelineConfig.model_validate(cfg))
    _assert_names(info, "a", "args", "bogus")


def test_a_failed_build_stops_the_stages_built_before_it(monkeypatch):
    """A stage may hold a process once built (llama.cpp launches its server at build): when a later stage fails
    to build, the ones built before it are stopped, not left running."""
    stopped: list[str] = []
    monkeypatch.setattr(toy.SimpleScheduler, "stop", lambda self: stopped.append(self.name))
    cfg = {"entry": "a", "stages": [stage("a", "create_identity", next="b"),
                                    stage("b", "create_identity", terminal=True, args={"bogus": 1})]}
    with pytest.raises(ConfigError):
        Coordinator(PipelineConfig.model_validate(cfg))
    assert len(stopped) == 1, stopped


def test_stream_to_a_scheduler_without_stream_hooks_raises_at_build():
    cfg = {"entry": "a", "stages": [stage("a", "create_talker", next="b", stream_to="b"),
                                    stage("b", "create_identity", terminal=True)]}
    config = PipelineConfig.model_validate(cfg)  # statically fine
    with pytest.raises(ConfigError) as info:
        Coordinator(config)
    _assert_names(info, "a", "stream_to", "'b'", "cannot accept streams")


def test_other_graph_errors_name_stage_and_field():
    bad = [
        ({"entry": "zz", "stages": [stage("a", "create_identity", terminal=True)]}, "zz", "entry"),
        ({"entry": "a", "stages": [stage("a", "create_identity", terminal=True),
                                   stage("a", "create_identity", terminal=True)]}, "a", "name"),
        ({"entry": "a", "stages": [stage("a", "create_identity")]}, "a", "next"),
        ({"entry": "a", "stages": [stage("a", "create_identity", next="a")]}, "a", "next"),
        ({"entry": "a", "stages": [stage("a", "create_identity", next="b"),
                                   stage("b", "create_identity", terminal=True, wait_for=["a"])]}, "b", "merge_fn"),
        ({"entry": "a", "stages": [stage("a", "create_identity", next="b"),
                                   stage("c", "create_identity", next="b"),
                                   stage("b", "create_identity", terminal=True, wait_for=["a", "x"],
                                         merge_fn=f"{M}:merge")]}, "b", "wait_for"),
    ]
    for cfg, name, field in bad:
        with pytest.raises((ConfigError, ValidationError)) as info:
            PipelineConfig.model_validate(cfg)
        _assert_names(info, name, field)


def test_from_file_overrides_patch_stage_args(tmp_path):
    import yaml

    path = tmp_path / "p.yml"
    path.write_text(yaml.safe_dump({"entry": "enc", "stages": [stage("enc", "create_encoder", terminal=True)]}))
    cfg = PipelineConfig.from_file(path, overrides={"enc": {"max_batch_wait_ms": 5}})
    assert cfg.stage("enc").args == {"max_batch_wait_ms": 5}
    coord = Coordinator(cfg)
    assert coord.stages["enc"].scheduler.max_batch_wait_s == pytest.approx(0.005)
