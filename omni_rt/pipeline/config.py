"""Declarative pipeline configuration (pydantic), loadable from YAML or TOML.

Routing is compiled from this at start-up (see ``omni_rt.pipeline.routing``); every validation error names the
stage and the field so a broken preset is fixed in one look.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ConfigError(ValueError):
    """A pipeline config that cannot run. The message starts with ``stage '<name>' field '<field>'``."""

    def __init__(self, stage: str, field: str, message: str) -> None:
        super().__init__(f"stage '{stage}' field '{field}': {message}")
        self.stage = stage
        self.field = field


def import_string(path: str) -> Any:
    """Import ``package.module:attr`` (or ``package.module.attr``)."""
    if ":" in path:
        module_name, attr = path.split(":", 1)
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ImportError(f"'{path}' is not an import path like 'package.module:name'")
    module = importlib.import_module(module_name)
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    except AttributeError as exc:
        raise ImportError(f"module '{module_name}' has no attribute '{attr}'") from exc


def resolve_callable(stage: str, field: str, path: str | None) -> Callable[..., Any] | None:
    if path is None:
        return None
    try:
        fn = import_string(path)
    except Exception as exc:  # noqa: BLE001 - any import failure is a config error
        raise ConfigError(stage, field, f"cannot import '{path}': {exc}") from exc
    if not callable(fn):
        raise ConfigError(stage, field, f"'{path}' is not callable")
    return fn


class StageConfig(BaseModel):
    """One stage: how to build its scheduler, where its results and stream chunks go."""

    model_config = ConfigDict(extra="forbid")

    name: str
    factory: str = Field(description="import path of a function returning a scheduler")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the factory")
    next: list[str] = Field(default_factory=list)
    route_fn: str | None = Field(None, description="fn(request_id, result) -> name(s) from `next`")
    project_payload: dict[str, str] = Field(default_factory=dict, description="target -> fn(request_id, result)")
    terminal: bool = False
    wait_for: list[str] = Field(default_factory=list, description="fan-in: sources to wait for")
    merge_fn: str | None = Field(None, description="fn(request_id, {source: payload}) -> payload")
    wait_for_fn: str | None = Field(None, description="fn(request_id, source, payload) -> subset of wait_for")
    stream_to: list[str] = Field(default_factory=list)
    can_accept_stream_before_payload: bool = False
    client_stream: bool = Field(False, description="also send this stage's stream chunks to the coordinator")

    @field_validator("next", "stream_to", "wait_for", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        return value


class PipelineRoles(BaseModel):
    """Which stage plays which part for a realtime session: the server reads these, never stage names.

    ``audio_in`` is the session stage that takes the client's audio (VAD + ASR); ``response`` is where an answer
    enters (default: ``entry``); ``text``, ``clauses`` and ``audio`` name the stages whose streams carry the
    answer's text, its spoken clauses (text + duration, for truncation) and its output audio.
    """

    model_config = ConfigDict(extra="forbid")

    audio_in: str | None = None
    response: str | None = None
    text: str | None = None
    clauses: str | None = None
    audio: str | None = None


STREAM_ROLES = ("text", "clauses", "audio")


class PipelineConfig(BaseModel):
    """A whole pipeline. ``entry`` is the default stage a new request enters at."""

    model_config = ConfigDict(extra="forbid")

    name: str = "pipeline"
    entry: str
    stages: list[StageConfig]
    roles: PipelineRoles = Field(default_factory=PipelineRoles)
    voices: list[str] = Field(default_factory=lambda: ["default"], min_length=1,
                              description="voices the talker can speak, the first is the default (session voice)")

    @model_validator(mode="after")
    def _check_graph(self) -> "PipelineConfig":
        validate_graph(self)
        return self

    def stage(self, name: str) -> StageConfig:
        for st in self.stages:
            if st.name == name:
                return st
        raise KeyError(name)

    @classmethod
    def from_file(cls, path: str | Path, overrides: dict[str, dict[str, Any]] | None = None) -> "PipelineConfig":
        """Load YAML (``.yaml``/``.yml``) or TOML (``.toml``); ``overrides`` patches stage args by stage name."""
        path = Path(path)
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
        if overrides:
            for st in data.get("stages", []):
                st.setdefault("args", {}).update(overrides.get(st["name"], {}))
        return cls.model_validate(data)


def validate_graph(cfg: PipelineConfig) -> None:
    """Static checks that need the whole graph: names, targets, fan-in sources, reachability of a terminal."""
    names = [s.name for s in cfg.stages]
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ConfigError(n, "name", "duplicate stage name")
        seen.add(n)
    if cfg.entry not in seen:
        raise ConfigError(cfg.entry, "entry", f"entry stage '{cfg.entry}' is not defined; stages: {names}")
    by_name = {s.name: s for s in cfg.stages}
    for st in cfg.stages:
        if st.terminal and st.next:
            raise ConfigError(st.name, "next", "a terminal stage has no `next`")
        if not st.terminal and not st.next:
            raise ConfigError(st.name, "next", "a non-terminal stage needs `next` (or set terminal: true)")
        for field in ("next", "stream_to"):
            for target in getattr(st, field):
                if target not in by_name:
                    raise ConfigError(st.name, field, f"unknown stage '{target}'; stages: {names}")
                if target == st.name:
                    raise ConfigError(st.name, field, "a stage cannot target itself")
        for target in st.project_payload:
            if target not in st.next:
                raise ConfigError(st.name, "project_payload", f"'{target}' is not in `next` {st.next}")
        if st.route_fn and not st.next:
            raise ConfigError(st.name, "route_fn", "route_fn may only pick from a static `next`, which is empty")
        for src in st.wait_for:
            if src not in by_name:
                raise ConfigError(st.name, "wait_for", f"unknown stage '{src}'")
            if st.name not in by_name[src].next:
                raise ConfigError(st.name, "wait_for", f"'{src}' does not list '{st.name}' in its `next`")
        if st.wait_for and not st.merge_fn:
            raise ConfigError(st.name, "merge_fn", "fan-in (`wait_for`) needs a merge_fn")
        if st.wait_for_fn and not st.wait_for:
            raise ConfigError(st.name, "wait_for_fn", "wait_for_fn needs a static `wait_for` to pick from")
    for role, target in cfg.roles.model_dump().items():
        if target is None:
            continue
        if target not in by_name:
            raise ConfigError(target, f"roles.{role}", f"role '{role}' names unknown stage '{target}'; stages: {names}")
        st = by_name[target]
        if role in STREAM_ROLES and not (st.client_stream or st.terminal):
            raise ConfigError(target, "client_stream", f"stage plays role '{role}': its stream must reach the client "
                              "(set client_stream: true)")
    # every stage reachable from the entry must be able to reach a terminal (a cycle without one never ends)
    reaches_terminal = {s.name for s in cfg.stages if s.terminal}
    changed = True
    while changed:
        changed = False
        for st in cfg.stages:
            if st.name not in reaches_terminal and any(t in reaches_terminal for t in st.next):
                reaches_terminal.add(st.name)
                changed = True
    for st in cfg.stages:
        if st.name not in reaches_terminal:
            raise ConfigError(st.name, "next", "no terminal stage is reachable from here (a cycle without a terminal?)")
