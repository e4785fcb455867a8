"""The memory a plan is checked against: `detect_capacity`.

Capacity is what the device has free now: on CPU the host's `MemAvailable` (device and host are one memory),
on GPU `torch.cuda.mem_get_info` of the first visible device plus the host's `MemAvailable` for offloaded
state. A given figure (`quartet plan --memory-gib`) or a named card's nominal memory (`planning.gpus`,
`--gpu h100`) replaces the device's; neither subtracts a reserve, as the measured figure does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quartet.config.errors import ConfigError
from quartet.planning.gpus import gpu_memory_bytes

__all__ = ["Capacity", "NoCudaDeviceError", "detect_capacity", "host_available_bytes"]


@dataclass(frozen=True)
class Capacity:
    """Free memory a plan is checked against."""

    device: str
    """`cpu` or `gpu`."""
    device_bytes: int
    """Free device memory (on CPU: the host's available memory)."""
    host_bytes: int
    """Free host memory (on CPU: the same figure)."""
    source: str
    """Where the figures came from, in words."""


class NoCudaDeviceError(ConfigError):
    """A GPU plan on a machine where torch sees no CUDA device, with no memory figure given for it."""


def host_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """`MemAvailable` of /proc/meminfo (Linux), else total physical memory from `os.sysconf`."""
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def detect_capacity(device: str, memory_bytes: int | None = None, gpu: str | None = None) -> Capacity:
    """Free memory of this machine for a `device` plan; `memory_bytes` overrides the device's figure (to
    plan for a device other than this machine's, e.g. `quartet plan --memory-gib 24`), and `gpu` names a
    card whose nominal memory to plan for instead (`planning.gpus`, e.g. `quartet plan --gpu h100`; a `gpu`
    plan then). Host memory is this machine's either way. Raises `NoCudaDeviceError` for a GPU plan on a
    machine without CUDA when neither is given."""
    host = host_available_bytes()
    if gpu is not None:
        nominal = gpu_memory_bytes(gpu)
        name = gpu.strip().lower()
        source = f"named GPU {name}, nominal {nominal // 2**30} GiB; host MemAvailable of this machine"
        return Capacity("gpu", nominal, host, source)
    if memory_bytes is not None:
        return Capacity(device, memory_bytes, memory_bytes if device == "cpu" else host, "given")
    if device == "cpu":
        return Capacity("cpu", host, host, "MemAvailable of /proc/meminfo")
    import torch

    if not torch.cuda.is_available():
        raise NoCudaDeviceError(
            "device",
            "the plan is for a GPU but torch sees no CUDA device on this machine",
            "give the GPU's memory (quartet plan --gpu NAME or --memory-gib N), or plan with --device cpu",
        )
    free, _total = torch.cuda.mem_get_info(0)
    name = torch.cuda.get_device_name(0)
    return Capacity("gpu", int(free), host, f"torch.cuda.mem_get_info of {name}; host MemAvailable")
