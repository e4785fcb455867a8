"""Measuring memory for real: peak resident set size of this process, and of a callable in a fresh one.

Peak RSS on Linux is the address space's high-water mark, `VmHWM` in /proc/self/status; writing `5` to
/proc/self/clear_refs resets it to the current RSS (Linux >= 4.0), so a phase's peak can be read apart
from what came before it. `resource.getrusage(RUSAGE_SELF).ru_maxrss` (KiB on Linux, bytes on macOS) is
the fallback, with a trap that makes it useless in a child process: exec copies the parent's high-water
mark into the child's, so a child of a 2 GB pytest process starts at "2 GB". `VmHWM` is per address space
and starts fresh.

`measure_peak_rss(fn)` runs `fn` in a new interpreter (multiprocessing `spawn`, or `forkserver` whose
server has imported torch and transformers once: forks of it start in a few milliseconds instead of
seconds). The child imports the `preload` modules, warms torch up (thread pool, autograd), records its RSS
as the baseline, resets the peak, calls `fn`, and reports the peak. `increase_bytes` is then what `fn`
added to a process that already had the libraries loaded, which is what the planner estimates. `fn` may
call `reset_peak_rss()` after its own setup to measure only what follows (the setup's resident memory
still counts: it is above the baseline). With CUDA, `torch.cuda.max_memory_allocated()` is reported too.
"""

from __future__ import annotations

import gc
import importlib
import multiprocessing as mp
import resource
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Measurement",
    "MeasurementError",
    "cuda_peak_bytes",
    "current_rss_bytes",
    "measure_peak_rss",
    "peak_rss_bytes",
    "reset_peak_rss",
]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class MeasurementError(RuntimeError):
    """The measured callable failed or timed out in its subprocess."""


def _status_kib(key: str) -> int | None:
    try:
        text = _STATUS.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def peak_rss_bytes() -> int:
    """Peak resident set size of this process in bytes (`VmHWM`, else `ru_maxrss`)."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(maxrss) if sys.platform == "darwin" else int(maxrss) * 1024


def current_rss_bytes() -> int:
    """Resident set size now (`VmRSS`; where /proc is missing, the peak stands in for it)."""
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else peak_rss_bytes()


def reset_peak_rss() -> bool:
    """Reset the peak to the current RSS; False where the OS does not allow it (then peaks accumulate)."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def cuda_peak_bytes() -> int | None:
    """`torch.cuda.max_memory_allocated()` when torch is imported and sees CUDA, else None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return int(torch.cuda.max_memory_allocated())


@dataclass(frozen=True)
class Measurement:
    """Memory of one call in a fresh process."""

    baseline_bytes: int
    """RSS after imports and warm-up, before the call."""

    peak_bytes: int
    """Peak RSS during the call (after the last `reset_peak_rss`)."""

    cuda_peak_bytes: int | None
    """Peak CUDA memory allocated by tensors during the call, when CUDA is used."""

    result: Any
    """What the callable returned (it must be picklable)."""

    @property
    def increase_bytes(self) -> int:
        """Peak RSS above the baseline: the memory the call needed."""
        return self.peak_bytes - self.baseline_bytes


def _warm_up() -> None:
    """Start torch's intra-op threads and the autograd engine so that they count in the baseline."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    x = torch.randn(64, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
    (y.float().sum() + (x @ x).sum()).backward()


def _child(
    conn: Connection,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    preload: Sequence[str],
) -> None:
    try:
        for name in preload:
            importlib.import_module(name)
        _warm_up()
        gc.collect()
        baseline = current_rss_bytes()
        reset_peak_rss()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        result = fn(*args, **kwargs)
        conn.send(("ok", Measurement(baseline, peak_rss_bytes(), cuda_peak_bytes(), result)))
    except BaseException:  # report every failure to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def measure_peak_rss(
    fn: Callable[..., Any],
    *args: Any,
    context: Literal["spawn", "forkserver"] = "spawn",
    preload: Sequence[str] = ("torch", "transformers"),
    timeout_s: float = 600.0,
    **kwargs: Any,
) -> Measurement:
    """Run `fn(*args, **kwargs)` in a fresh process and return its memory (see the module doc).

    `fn` must be importable by name (a module-level function) and its arguments and result picklable.
    With `context="forkserver"` the server preloads `preload` (effective when this call starts the server).
    """
    ctx = mp.get_context("forkserver") if context == "forkserver" else mp.get_context("spawn")
    if context == "forkserver":
        ctx.set_forkserver_preload(list(preload))
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args, kwargs, tuple(preload)), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise MeasurementError(f"{getattr(fn, '__name__', fn)} did not finish within {timeout_s:.0f} s")
        status, payload = parent.recv()
    except EOFError:
        proc.join(5.0)
        raise MeasurementError(
            f"{getattr(fn, '__name__', fn)} ended its process without a result (exit code {proc.exitcode}; "
            "killed for memory?)"
        ) from None
    finally:
        parent.close()
        if proc.is_alive():
            proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if status != "ok":
        raise MeasurementError(f"{getattr(fn, '__name__', fn)} failed in its subprocess:\n{payload}")
    assert isinstance(payload, Measurement)
    return payload
