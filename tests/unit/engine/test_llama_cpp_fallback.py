"""The llama.cpp thinker without a usable ``llama-server``: no binary falls back to the PyTorch thinker with
one warning, and a cached binary that cannot run (a stub script here) is not used. The thinker on the real
llama-server: tests/integration/test_engine_llamacpp.py.
"""

from __future__ import annotations

import logging

from omni_rt.engine.llama_cpp import build as llama_cpp
from omni_rt.engine.factory import create_ar_scheduler
from omni_rt.engine.prompt.request import parse_request
from omni_rt.testing.stage_driver import collect, send, wait_until

SYSTEM = {"role": "system", "content": "You are a helpful voice assistant. Answer in one short sentence."}


def _q(text: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": text}]


def _ask(s, rid: str, messages: list[dict], **kw) -> dict:
    send(s, rid, {"messages": messages, "session_id": kw.pop("session_id", rid), **kw})
    return collect(s, [rid], timeout=60)[rid]


def test_falls_back_to_torch_without_binary(tmp_path, caplog):
    from omni_rt.engine.builtin.ar_scheduler import ARScheduler

    with caplog.at_level(logging.WARNING, logger="omni_rt.engine.factory"):
        s = create_ar_scheduler("smollm2", backend="llama.cpp", llama_cpp_root=tmp_path / "empty",
                                max_batch_size=1, kv_budget_tokens=1024, default_max_tokens=8)
    assert isinstance(s, ARScheduler)
    warnings = [r for r in caplog.records if "falling back to the PyTorch thinker" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    s.start()
    try:
        got = _ask(s, "fb", _q("What is the capital of France?"))
        assert got["error"] is None and got["result"]["completion_tokens"] > 0
    finally:
        s.stop()


def test_a_cached_binary_that_cannot_run_is_not_used(tmp_path):
    import json

    d = llama_cpp.build_dir(tmp_path)
    d.mkdir(parents=True)
    (d / llama_cpp.BINARY_NAME).write_text("#!/bin/sh\nexit 132\n")  # e.g. built for another CPU
    (d / llama_cpp.BINARY_NAME).chmod(0o755)
    (d / "build.json").write_text(json.dumps({"key": llama_cpp.build_key()}))
    assert llama_cpp.locate_binary(tmp_path) is None
    (d / llama_cpp.BINARY_NAME).write_text("#!/bin/sh\nexit 0\n")
    assert llama_cpp.locate_binary(tmp_path) == d / llama_cpp.BINARY_NAME
