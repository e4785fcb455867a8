"""What every step of issue 37's GPU script (`goals.py`) shares: where it runs, its deadline, the JSON part it
writes as it goes, and the two device rates the goals are measured against (HBM bandwidth, bf16 matmul).

A step runs in its own process with a deadline; it writes its part file after every case it finishes, so a
step killed at its deadline still leaves every figure it measured (the orchestrator reads the file).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Step:
    """One step's process: device, sizes (dry run: CPU, tiny), deadline (a `time.time()`), part file."""

    device: str
    dry_run: bool
    deadline: float
    part: Path
    work: Path

    def __post_init__(self) -> None:
        self.record: dict[str, Any] = {}

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def left(self) -> float:
        """Seconds left before this step's deadline."""
        return self.deadline - time.time()

    def put(self, key: str, value: Any) -> None:
        """Record one case's result and rewrite the part file at once."""
        self.record[key] = value
        tmp = self.part.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=2, default=str) + "\n")
        tmp.replace(self.part)
        log(f"  {key}: {_short(value)}")

    def fits(self, key: str, estimate_s: float) -> bool:
        """Whether a case estimated at `estimate_s` seconds fits before the deadline; records a skip if not.
        A dry run runs everything."""
        if self.dry_run or self.left() >= estimate_s:
            return True
        self.put(key, {"status": "skip", "reason": f"needs ~{estimate_s:.0f} s, {self.left():.0f} s left"})
        return False

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def log(message: str) -> None:
    """A line for the run's log (stdout, which device_run.sh tees into $OUT)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) < 400 else text[:400] + " ..."


def timed(step: Step, fn: Any, repeats: int) -> list[float]:
    """Wall seconds of `repeats` calls of `fn`, the device synchronized around each."""
    out = []
    for _ in range(repeats):
        step.sync()
        t0 = time.perf_counter()
        fn()
        step.sync()
        out.append(time.perf_counter() - t0)
    return out


def hbm_bandwidth(step: Step) -> float:
    """Bytes/s of a device-to-device copy, counting the bytes read and the bytes written (the decode roofline
    reads weights and KV once a step, so it divides bytes read by this rate)."""
    n = 16 * 2**20 if step.dry_run else 2 * 2**30
    src = torch.empty(n, dtype=torch.uint8, device=step.device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = statistics.median(timed(step, lambda: dst.copy_(src), 3 if step.dry_run else 20))
    return 2 * n / seconds


def matmul_rate(step: Step) -> float:
    """FLOP/s of a bf16 matmul (8192^3 on GPU; fp32 512^3 in a dry run): the MFU's denominator."""
    n, dtype = (512, torch.float32) if step.dry_run else (8192, torch.bfloat16)
    a = torch.randn(n, n, device=step.device, dtype=dtype)
    b = torch.randn(n, n, device=step.device, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b)
    seconds = statistics.mean(timed(step, lambda: torch.mm(a, b), 10))
    return 2 * n**3 / seconds


def quartet_command() -> list[str]:
    """`quartet` as a command on a machine without the console script (a working-tree copy on the path)."""
    return [sys.executable, "-m", "quartet.cli.main"]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this one's, with `src` first on the path."""
    path = os.environ.get("PYTHONPATH", "")
    src = str(ROOT / "src")
    env = dict(os.environ)
    env["PYTHONPATH"] = src if not path else f"{src}{os.pathsep}{path}"
    env.update(extra)
    return env
