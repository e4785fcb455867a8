"""Step e of issue 37's GPU script: the GPU checks other parts of the issue bring, each run where it exists.

- `benchmarks/fused_head.py --device cuda`: the fused log-prob/entropy head against the plain one;
- `benchmarks/gpu/cuda_ipc_check.py`: weights to a rollout process over CUDA IPC handles, two processes on
  the one GPU;
- `quartet demo --device gpu`: the demo at a GPU size (5 minutes: runs only when that much is left).

Each runs as a child with the time left as its limit; its output's tail, its exit status, and any JSON file it
wrote under `benchmarks/results/` (new or changed while it ran) are recorded. A dry run only says which exist.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from goal_io import ROOT, Step, child_env, log, quartet_command

RESULTS = ROOT / "benchmarks" / "results"


def hooks(step: Step) -> list[tuple[str, list[str], float, bool]]:
    """(name, command, estimated seconds, present) of each hook; each writes its JSON under `step.work`."""
    demo_has_device = '"--device"' in (ROOT / "src" / "quartet" / "cli" / "demo.py").read_text()
    fused, ipc = ROOT / "benchmarks" / "fused_head.py", ROOT / "benchmarks" / "gpu" / "cuda_ipc_check.py"
    out = step.work
    return [
        ("fused_head", [sys.executable, str(fused), "--device", "cuda", "--out-dir", str(out / "fused_head")],
         60.0, fused.exists()),
        ("cuda_ipc", [sys.executable, str(ipc), "--out", str(out / "cuda_ipc" / "cuda_ipc.json")], 60.0,
         ipc.exists()),
        ("demo_gpu", [*quartet_command(), "demo", "--device", "gpu"], 300.0, demo_has_device),
    ]  # fmt: skip


def _json_written_since(start: float, folders: list[Path]) -> dict[str, Any]:
    """JSON files (small ones) under `folders` written after `start`, by path."""
    found: dict[str, Any] = {}
    for path in (p for folder in folders if folder.exists() for p in folder.rglob("*.json")):
        if path.stat().st_mtime >= start and path.stat().st_size < 200_000:
            try:
                name = str(path.relative_to(ROOT)) if ROOT in path.parents else path.name
                found[name] = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
    return found


def run_hook(step: Step, command: list[str]) -> dict[str, Any]:
    """One hook as a child with the step's time left; its exit status, output tail and the JSON it wrote."""
    for arg in command:  # the hook's own output folder, made for it
        if arg.startswith(str(step.work)):
            (Path(arg).parent if arg.endswith(".json") else Path(arg)).mkdir(parents=True, exist_ok=True)
    start = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=max(step.left() - 5, 1),
                              env=child_env(), cwd=ROOT)  # fmt: skip
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        code = None
        out = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
    result: dict[str, Any] = {
        "status": "pass" if code == 0 else "fail",
        "exit_status": code,
        "seconds": round(time.time() - start, 2),
        "output_tail": out[-3000:],
    }
    if code is None:
        result["reason"] = "stopped at the step's deadline"
    written = _json_written_since(start, [step.work, RESULTS])
    if written:
        result["results_written"] = written
    return result


def run(step: Step) -> None:
    for name, command, estimate, present in hooks(step):
        if not present:
            step.put(name, {"status": "skip", "reason": f"not in this tree: {' '.join(command[1:3])}"})
        elif step.dry_run:
            step.put(name, {"status": "skip", "reason": "dry run: the hook is there; it runs on a GPU"})
        elif step.fits(name, estimate):
            step.put(name, run_hook(step, command))
    log("hooks: done")


def demo_seconds(part: dict[str, Any]) -> float | None:
    """The GPU demo's wall seconds when it passed (the goal: under 5 minutes)."""
    demo = part.get("demo_gpu", {})
    return float(demo["seconds"]) if demo.get("status") == "pass" else None
