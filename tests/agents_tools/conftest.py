"""Fixtures for the Python tool's sandbox tests: the tool in each mode, what its runs made, a listener."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_helpers import MODES, SandboxRuns, make_tool

from quartet.agents.tools import sandbox
from quartet.agents.tools.python_runner import PythonTool


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def tool(mode: str) -> PythonTool:
    return make_tool(mode, timeout_s=2, cpu_time_s=1, memory_mb=256, max_processes=16)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> SandboxRuns:
    """Records what the runs of this test make: their temporary folders and (a root host) their uids."""
    made = SandboxRuns()
    real_mkdtemp, real_uid = tempfile.mkdtemp, sandbox._fresh_uid

    def mkdtemp(*args: Any, **kwargs: Any) -> str:
        path: str = real_mkdtemp(*args, **kwargs)
        made.workdirs.append(Path(path))
        return path

    def fresh_uid() -> int:
        uid = real_uid()
        made.uids.add(uid)
        return uid

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(sandbox, "_fresh_uid", fresh_uid)
    return made


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()
