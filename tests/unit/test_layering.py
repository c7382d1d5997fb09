"""Imports point down the layers, never back up: the order is written once, here and in the README.

Every import of ``omni_rt`` inside ``omni_rt`` (module level, function level and ``TYPE_CHECKING`` alike, since
each is a dependency a reader has to follow) must go to the same layer or one listed before it, and no
modules may import each other in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "omni_rt"

# bottom first; a layer may import itself and anything to its left
LAYERS = [
    "contracts",  # shared vocabulary: typed payloads and events, parsed configs, rates
    "resources",  # where package data lives
    "audio",  # formats and conversions
    "pipeline",  # stage shell, schedulers, coordinator, pipeline config
    "presets",  # preset files -> PipelineConfig
    "backends",  # model wrappers: VAD, ASR, TTS, codecs, turn model
    "engine",  # the AR engines behind the thinker/talker
    "stages",  # stage workers built from backends and engines
    "realtime",  # OpenAI Realtime events and session config (sans-I/O)
    "session",  # the sans-I/O RealtimeSession
    "transports",  # WebSocket, Twilio: adapters that move bytes
    "server",  # app, settings, metrics, runtime
    "prepare",  # weight preparation (CLI command)
    "inventory",  # what is cached and what each preset uses (CLI command)
    "cli",
    "testing",  # helpers shared by the tests and latency_bench (nothing in omni_rt imports them)
]


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every ``omni_rt`` import in one file."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1])  # what a relative import is relative to
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] if node.module or not node.level else [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out += [(node.lineno, n) for n in names if n == "omni_rt" or n.startswith("omni_rt.")]
    return out


def upward_imports() -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        src = layer_of(module)
        for line, target in imports_of(path):
            dst = layer_of(target)
            if src == "(root)" or dst == "(root)":
                continue  # omni_rt/__init__.py: the version only
            if dst not in rank or src not in rank:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: layer {src if src not in rank else dst!r} is not in LAYERS")
            elif rank[dst] > rank[src]:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {src} imports {target} ({dst} is above {src})")
    return found


def import_circles() -> list[list[str]]:
    """Groups of modules that import each other, directly or round about (any kind of import, as above)."""
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        deps = set()
        for _, target in imports_of(path):
            while target and target not in modules:  # ``from pkg.mod import name``: the module, not the name
                target = target.rpartition(".")[0]
            if target and target != module and target != "omni_rt":
                deps.add(target)
        graph[module] = deps
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_every_package_is_a_layer() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p.is_dir() and (p / "__init__.py").exists())}
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert packages | modules == set(LAYERS), "add the new folder to LAYERS (and the README's layer list)"


def test_imports_point_down() -> None:
    assert upward_imports() == []


def test_no_import_circles() -> None:
    """Within a layer too: a module never needs, through any chain, a module that needs it."""
    assert import_circles() == []


def test_the_check_sees_an_import_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "omni_rt" / "session"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text("def f():\n    from omni_rt.session.handlers import dispatch\n")
    (pkg / "handlers.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .core import f\n")
    (pkg / "turn.py").write_text("from omni_rt.session import core\n")
    globals()["PACKAGE"], saved = pkg.parent, PACKAGE
    try:
        found = import_circles()
    finally:
        globals()["PACKAGE"] = saved
    assert found == [["omni_rt.session.core", "omni_rt.session.handlers"]], found


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a module of a lower layer that imports a higher one is reported."""
    pkg = tmp_path / "omni_rt"
    for layer in ("contracts", "server"):
        (pkg / layer).mkdir(parents=True)
        (pkg / layer / "__init__.py").write_text("")
    (pkg / "contracts" / "bad.py").write_text("def f():\n    from omni_rt.server import app\n")
    (pkg / "server" / "good.py").write_text("from ..contracts import bad\n")
    globals()["PACKAGE"], saved = pkg, PACKAGE
    try:
        found = upward_imports()
    finally:
        globals()["PACKAGE"] = saved
    assert len(found) == 1 and "contracts imports omni_rt.server" in found[0], found
