"""Helpers for the Python tool's sandbox tests: the tool in each mode this machine offers, running code,
finding a run's leftover processes (this test's runs only: another test process on this machine, e.g. a
second copy of the suite, has sandbox processes of its own)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from quartet.agents.tools.base import ToolResult
from quartet.agents.tools.python_runner import PythonTool
from quartet.agents.tools.sandbox_boundary import find_boundary

MISSING_BWRAP = "/nonexistent/bwrap"  # "no boundary can be built here", on any machine
SANDBOX_UID_BASE = 1_500_000_000  # the runs' fresh uids on a root host start here (sandbox._UID_BASE)
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


@dataclass
class SandboxRuns:
    """What the runs of one test made: their host folders and (a root host) their fresh uids.

    A run's processes carry one of these marks: they start in its folder, and as root they run under its
    uid, which the program cannot give up (it has no capabilities) even where it leaves the folder.
    """

    workdirs: list[Path] = field(default_factory=list)
    uids: set[int] = field(default_factory=set)


def _is_of(proc: psutil.Process, runs: SandboxRuns) -> bool:
    if proc.status() == psutil.STATUS_ZOMBIE:
        return False
    if set(proc.uids()) & runs.uids:
        return True
    return bool(proc.cwd().startswith(tuple(map(str, runs.workdirs))))


def leftovers(runs: SandboxRuns) -> list[psutil.Process]:
    """Live processes of `runs`: started in one of their host folders, or (root host) of one of their uids.

    Never "every sandbox process": a sandbox uid or a boot script of another run is not this test's.
    """
    found = []
    for proc in psutil.process_iter():
        try:
            if _is_of(proc, runs):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_clean(runs: SandboxRuns) -> None:
    """No process of the runs is left, and their host folders are gone."""
    deadline = time.monotonic() + 2.0
    while (left := leftovers(runs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left running: {[(p.pid, p.cmdline()) for p in left]}"
    assert runs.workdirs and not any(d.exists() for d in runs.workdirs), "temporary directory not removed"
