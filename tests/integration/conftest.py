"""Integration tests: everything under tests/integration/ starts a server, a subprocess, a browser or an SDK.

Each test here gets the ``integration`` marker (``python -m pytest -m "not integration"`` runs the unit tests
alone; a test under tests/unit/ that runs a real model for seconds carries the marker in place), and
``live_server``: the CPU-preset server most end-to-end tests talk to, one process per test session
(``torch_server``: the same with the PyTorch thinker).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from servers import KEYED_API_KEY, KEYED_MAX_MESSAGE_BYTES, start_server, stop_server

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def live_server(tmp_path_factory):
    """The CPU-preset server every end-to-end test talks to (one process for the whole session)."""
    server = start_server(tmp_path_factory.mktemp("server"), "--max-sessions", "8")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def torch_server(tmp_path_factory):
    """The CPU preset with the built-in PyTorch thinker instead of llama.cpp (everything else the same), one
    process for the session: what its grammar-constrained tool calls, the Agents SDK on both engines and its
    history window are tested on."""
    import yaml

    from omni_rt.resources import preset_dir

    tmp = tmp_path_factory.mktemp("torch-server")
    preset = yaml.safe_load((preset_dir() / "cpu.yaml").read_text())
    next(st for st in preset["stages"] if st["name"] == "thinker")["args"]["backend"] = "torch"
    (tmp / "cpu-torch.yaml").write_text(yaml.safe_dump(preset))
    server = start_server(tmp, "--preset", str(tmp / "cpu-torch.yaml"), "--max-sessions", "4")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory):
    """A server with an API key and small limits (2 sessions, 64 KiB messages), one process for the session: the
    auth and limit tests of the Realtime, GPT-Live and HTTP surfaces."""
    server = start_server(tmp_path_factory.mktemp("keyed"), "--max-sessions", "2", "--api-key", KEYED_API_KEY,
                          "--max-message-bytes", str(KEYED_MAX_MESSAGE_BYTES))
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def delegating_server(tmp_path_factory):
    """A server that delegates every GPT-Live turn to the client (``--live-delegation always``), one process for
    the session (the raw protocol's and Pipecat's delegation tests)."""
    server = start_server(tmp_path_factory.mktemp("live-deleg"), "--live-delegation", "always", "--max-sessions", "4")
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def responses_server(tmp_path_factory):
    """A server that delegates every GPT-Live turn (``--live-delegation always``) to the operator's Responses
    backend: SmolLM2 behind omni-rt's own OpenAI-compatible chat server, in this process. One per test module."""
    from omni_rt.engine.factory import create_ar_scheduler
    from omni_rt.engine.streamed.openai_compat_server import ServerThread, create_app

    sched = create_ar_scheduler("smollm2", max_batch_size=2, default_max_tokens=40)
    backend = ServerThread(create_app(sched, model_name="smollm2")).start(timeout=120)
    server = start_server(tmp_path_factory.mktemp("live-responses"), "--live-delegation", "always",
                          "--delegate", backend.base_url, "--max-sessions", "2")
    yield server
    stop_server(server)
    backend.stop()
