"""Fixtures for the Python tool's sandbox tests: the tool in each mode, the run's host folders, a listener."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_helpers import MODES, make_tool

from quartet.agents.tools.python_runner import PythonTool


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def tool(mode: str) -> PythonTool:
    return make_tool(mode, timeout_s=2, cpu_time_s=1, memory_mb=256, max_processes=16)


@pytest.fixture
def workdirs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Records the temporary directories the runner makes."""
    made: list[Path] = []
    real = tempfile.mkdtemp

    def spy(*args: Any, **kwargs: Any) -> str:
        path: str = real(*args, **kwargs)
        made.append(Path(path))
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    return made


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()
