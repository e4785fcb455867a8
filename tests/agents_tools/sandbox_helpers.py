"""Helpers for the Python tool's sandbox tests: the tool in each mode this machine offers, running code,
finding a run's leftover processes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from quartet.agents.tools.base import ToolResult
from quartet.agents.tools.python_runner import PythonTool
from quartet.agents.tools.sandbox_boundary import find_boundary

MISSING_BWRAP = "/nonexistent/bwrap"  # "no boundary can be built here", on any machine
SANDBOX_UID_BASE = 1_500_000_000  # the runs' fresh uids on a root host (sandbox._UID_BASE)
MODES = ["bwrap", "unisolated", "unisolated-no-namespaces"]


def no_boundary_reason() -> str | None:
    """Why bwrap cannot build a sandbox on this machine; None when it can."""
    found = find_boundary(None)
    return found if isinstance(found, str) else None


def make_tool(mode: str, **limits: Any) -> PythonTool:
    """The tool in `mode`, skipping the test where that mode is not available here."""
    if mode == "bwrap":
        reason = no_boundary_reason()
        if reason is not None:
            pytest.skip(f"no bwrap boundary on this machine: {reason}")
        return PythonTool(**limits)
    return PythonTool(**limits, bwrap=MISSING_BWRAP, allow_unisolated=True, namespaces=mode == "unisolated")


def run(tool: PythonTool, code: str) -> ToolResult:
    return asyncio.run(tool.execute("test", {"code": code}))


def leftovers(workdirs: list[Path]) -> list[psutil.Process]:
    """Live processes of a run: started in one of its host folders, or (root host) of a sandbox uid."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            sandbox_uid = os.geteuid() == 0 and proc.uids().real >= SANDBOX_UID_BASE
            if sandbox_uid or proc.cwd().startswith(tuple(map(str, workdirs))):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_clean(workdirs: list[Path]) -> None:
    """No process of the run is left, and its host folder is gone."""
    deadline = time.monotonic() + 2.0
    while (left := leftovers(workdirs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left running: {[(p.pid, p.cmdline()) for p in left]}"
    assert workdirs and not any(d.exists() for d in workdirs), "temporary directory not removed"
