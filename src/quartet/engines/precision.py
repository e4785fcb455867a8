"""`mixed_precision: auto`: bfloat16 only where this machine computes it faster than float32.

CPUs differ by orders of magnitude in bfloat16: with AMX a bf16 matmul runs ~4x faster than fp32, with
AVX-512 but no AMX about half as fast, with AVX2 only ~300x slower (2048 x 2048 matmuls measured on three
2-core machines of the project's CI kind). So `auto` measures instead of guessing:

- CUDA: bfloat16 where the device supports it (`torch.cuda.is_bf16_supported()`), else float32.
- CPU: a 512 x 512 matmul timed in float32 and in bfloat16 (the fastest of the calls made in about
  `BUDGET_S` each, with the process's torch threads); bfloat16 when its GFLOP/s reach `MARGIN` x float32's,
  else float32.

The CPU figure is cached per machine in `$XDG_CACHE_HOME/quartet/precision.json` (default
`~/.cache/quartet/`), keyed by the CPU model, torch's CPU capability, the torch version and the thread
count, so the measurement runs once per machine. `QUARTET_AUTO_PRECISION=float32|bfloat16` pins the choice
(no measurement). `quartet doctor` prints the figures.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from quartet.config.model import Dtype

__all__ = ["MARGIN", "MatmulFigures", "auto_precision", "measure_matmul", "resolve_precision"]

log = logging.getLogger(__name__)

MARGIN = 1.1
"""bfloat16 must run at least this many times float32's GFLOP/s to be chosen."""
BUDGET_S = 0.15
SIZE = 512
ENV = "QUARTET_AUTO_PRECISION"


@dataclass(frozen=True)
class MatmulFigures:
    """What `auto` measured (or read from the cache) on this machine, and what it chose."""

    key: str
    float32_gflops: float
    bfloat16_gflops: float
    choice: str
    cache: str = ""

    @property
    def ratio(self) -> float:
        return self.bfloat16_gflops / max(self.float32_gflops, 1e-9)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{_cpu_model()} | {capability} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def _gflops(dtype: torch.dtype, size: int = SIZE, budget_s: float = BUDGET_S) -> float:
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)  # warm-up: kernels chosen, pages touched
    best, start = float("inf"), time.perf_counter()
    while True:  # the fastest call: what the machine can do, least bent by other work sharing the cores
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start >= budget_s:
            return 2 * size**3 / best / 1e9


def measure_matmul(budget_s: float = BUDGET_S) -> MatmulFigures:
    """Time the two matmuls now (no cache)."""
    fp32 = _gflops(torch.float32, budget_s=budget_s)
    bf16 = _gflops(torch.bfloat16, budget_s=budget_s)
    choice = Dtype.BFLOAT16 if bf16 >= MARGIN * fp32 else Dtype.FLOAT32
    return MatmulFigures(machine_key(), round(fp32, 2), round(bf16, 2), choice.value)


def _cache_file() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "quartet" / "precision.json"


def auto_precision(refresh: bool = False) -> MatmulFigures:
    """This machine's CPU figures: from the cache when its key matches, else measured and cached."""
    file, key = _cache_file(), machine_key()
    if not refresh:
        try:
            cached = json.loads(file.read_text()).get(key)
            if cached:
                return MatmulFigures(**{**cached, "cache": str(file)})
        except (OSError, ValueError, TypeError):
            pass
    figures = measure_matmul()
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(file.read_text())
        except (OSError, ValueError):
            table = {}
        table[key] = {k: v for k, v in asdict(figures).items() if k != "cache"}
        with tempfile.NamedTemporaryFile("w", dir=file.parent, delete=False, suffix=".tmp") as tmp:
            json.dump(table, tmp, indent=2)
        os.replace(tmp.name, file)
    except OSError as err:  # a read-only home: measure again next time
        log.info("precision figures not cached (%s): %s", file, err)
        return figures
    log.info(
        "mixed_precision=auto: bf16 %.1f vs fp32 %.1f GFLOP/s -> %s",
        figures.bfloat16_gflops,
        figures.float32_gflops,
        figures.choice,
    )
    return MatmulFigures(**{**asdict(figures), "cache": str(file)})


def resolve_precision(requested: Dtype | str, device: str | None = None) -> Dtype:
    """`requested` itself, or for `auto` this machine's choice (module docstring)."""
    requested = Dtype(requested)
    if requested is not Dtype.AUTO:
        return requested
    pinned = os.environ.get(ENV, "")
    if pinned:
        choice = Dtype(pinned)
        if choice is Dtype.AUTO:
            raise ValueError(f"{ENV}={pinned}: pin float32 or bfloat16 (or unset it to measure)")
        return choice
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        return Dtype.BFLOAT16 if torch.cuda.is_bf16_supported() else Dtype.FLOAT32
    return Dtype(auto_precision().choice)
