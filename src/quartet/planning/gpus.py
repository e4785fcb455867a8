"""GPUs by name: plan for the card a run will use from a machine without it (`quartet plan --gpu h100`).

Each figure is the card's nominal memory (the size it is sold with: an H100 has 80 GiB, an H200 141),
read as GiB. The driver reports a little less (an "80 GB" H100 shows about 79.6 GiB in total, and the CUDA
context takes some of that). The planner subtracts no reserve from these figures. It subtracts none from a
measured device either: `fit.detect_capacity` takes `torch.cuda.mem_get_info`'s free bytes as they are. The
same `fit.HEADROOM` (a plan may use 90%) covers the context, fragmentation and the few percent the nominal
figure overstates.
"""

from __future__ import annotations

__all__ = ["NOMINAL_GIB", "UnknownGpuError", "gpu_memory_bytes", "known_gpus"]

NOMINAL_GIB: dict[str, int] = {
    "h100": 80,
    "h200": 141,
    "a100-80g": 80,
    "a100-40g": 40,
    "l40s": 48,
    "a10g": 24,
    "rtx4090": 24,
    "l4": 24,
    "v100-32g": 32,
    "v100-16g": 16,
    "t4": 16,
}
"""Nominal memory of each known GPU, in GiB, by the name `--gpu` takes (lower case)."""


class UnknownGpuError(ValueError):
    """A GPU name outside `NOMINAL_GIB`; the message lists the known ones."""


def known_gpus() -> str:
    """`h100 (80 GiB), h200 (141 GiB), ...`: the names `--gpu` takes, with their nominal memory."""
    return ", ".join(f"{name} ({gib} GiB)" for name, gib in NOMINAL_GIB.items())


def gpu_memory_bytes(name: str) -> int:
    """The nominal memory of GPU `name` (case-insensitive) in bytes; `UnknownGpuError` for other names."""
    gib = NOMINAL_GIB.get(name.strip().lower())
    if gib is None:
        raise UnknownGpuError(f"unknown GPU '{name}'; known: {known_gpus()}")
    return gib * 2**30
