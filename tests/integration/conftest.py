"""Integration tests: everything under tests/integration/ starts a server, a subprocess, a browser or an SDK.

Each test here gets the ``integration`` marker (``python -m pytest -m "not integration"`` runs the unit tests
alone; a test under tests/unit/ that runs a real model for seconds carries the marker in place), and
``live_server``: the CPU-preset server most end-to-end tests talk to, one process per test session.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from servers import start_server, stop_server

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
