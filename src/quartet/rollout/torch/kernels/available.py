"""Which decode kernels a device gets: the Triton kernels on CUDA where they import and compile, else torch.

`select_kernels(mode, device)` is read once per engine (`rollout.fused_kernels`):

- `off`: None, the runner's own torch path (unchanged);
- `auto` (default): on CUDA with Triton, each kernel is compiled and checked against its torch path on a
  tiny input; a kernel that fails to import, compile or match falls back to its torch path, with one log
  line saying why. Off CUDA, None (a CPU run does not change);
- `on`: as `auto`, but anything short of all three Triton kernels raises `KernelsUnavailableError` naming
  why.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from quartet.rollout.torch.kernels.rms_norm import add_rms_norm_torch, add_rms_norm_triton
from quartet.rollout.torch.kernels.rope_cache import rope_cache_torch, rope_cache_triton, signed_sin
from quartet.rollout.torch.kernels.sampler import sample_fused, sample_torch, sample_triton
from quartet.rollout.torch.sampling import RowSampling

__all__ = [
    "FUSED_KERNEL_MODES",
    "DecodeKernels",
    "GuardedKernel",
    "KernelsUnavailableError",
    "select_kernels",
    "torch_kernels",
    "triton_kernels",
    "triton_missing",
]

log = logging.getLogger(__name__)

FUSED_KERNEL_MODES = ("auto", "off", "on")
_logged: set[str] = set()


class KernelsUnavailableError(RuntimeError):
    """`rollout.fused_kernels=on` where a Triton kernel cannot run."""


@dataclass(frozen=True)
class DecodeKernels:
    """The three decode-step operations the runner and engine call, each a Triton kernel or its torch path.

    add_rms_norm(x, residual, weight, eps) -> (normed, x + residual);
    rope_cache(q, k, v, cos, sin_signed, k_cache, v_cache, lengths) -> rotated q;
    sample(logits, rows, uniforms, want_logprobs) -> (tokens, log-probs or None).
    `triton` names the operations that run as Triton kernels.
    """

    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rope_cache: Callable[..., torch.Tensor]
    sample: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    triton: frozenset[str] = field(default_factory=frozenset)


def torch_kernels() -> DecodeKernels:
    """Every operation on its torch path (what the runner computes without kernels, in fused form)."""
    return DecodeKernels(add_rms_norm_torch, rope_cache_torch, sample_torch)


def triton_kernels() -> DecodeKernels:
    """Every operation as a Triton kernel, unchecked (tests run these under `TRITON_INTERPRET=1`); the
    sampler as the engine uses it (`sampler.sample_fused`: filtering batches on the torch path for now)."""
    return DecodeKernels(
        add_rms_norm_triton,
        rope_cache_triton,
        sample_fused,
        frozenset({"add_rms_norm", "rope_cache", "sample"}),
    )


def triton_missing() -> str | None:
    """Why Triton cannot be used here (it does not import), or None when it imports."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # an ImportError, or a broken install raising anything else
        return f"triton does not import ({type(exc).__name__}: {exc}); install the `kernels` extra"
    return None


def select_kernels(mode: str, device: torch.device) -> DecodeKernels | None:
    """The kernels a decode step on `device` uses under `rollout.fused_kernels=mode` (None: the runner's own
    torch path). Never raises under `auto`; under `on`, raises `KernelsUnavailableError` naming why not."""
    if mode not in FUSED_KERNEL_MODES:
        raise ValueError(f"rollout.fused_kernels must be one of {FUSED_KERNEL_MODES}, got {mode!r}")
    if mode == "off":
        return None
    reason = triton_missing()
    if device.type != "cuda":
        reason = f"the engine runs on {device.type}, and the Triton kernels are built for CUDA"
    if reason is not None:
        if mode == "on":
            raise KernelsUnavailableError(f"rollout.fused_kernels=on, but {reason}; set it to auto or off")
        if device.type == "cuda":
            _log_once(f"fused decode kernels off: {reason}; decoding with the torch path")
        return None
    chosen = torch_kernels()
    triton = triton_kernels()
    used: set[str] = set()
    for name, check in (
        ("add_rms_norm", _check_norm),
        ("rope_cache", _check_rope),
        ("sample", _check_sample),
    ):
        failure = _try(check, device)
        if failure is None:
            guarded = GuardedKernel(name, getattr(triton, name), getattr(chosen, name), strict=mode == "on")
            part: dict[str, Any] = {name: guarded}
            chosen = dataclasses.replace(chosen, **part)
            used.add(name)
        elif mode == "on":
            raise KernelsUnavailableError(f"rollout.fused_kernels=on, but the {name} kernel {failure}")
        else:
            _log_once(f"fused decode kernel {name} off: it {failure}; using its torch path")
    return dataclasses.replace(chosen, triton=frozenset(used))


class GuardedKernel:
    """A selected kernel that falls back to its torch path for good the first time it raises (a shape its
    check did not compile, say), with one log line; under `strict` (`fused_kernels=on`) it raises
    `KernelsUnavailableError` instead. The engine's CUDA-graph warm-up runs eagerly before each capture,
    so a failure falls back there, before a graph could record the failing launch."""

    def __init__(
        self, name: str, kernel: Callable[..., Any], fallback: Callable[..., Any], strict: bool
    ) -> None:
        self.name = name
        self.kernel = kernel
        self.fallback = fallback
        self.strict = strict
        self.failed = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failed:
            try:
                return self.kernel(*args, **kwargs)
            except Exception as exc:  # a compiler or launch error of any kind: the torch path computes it
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                if self.strict:
                    raise KernelsUnavailableError(
                        f"rollout.fused_kernels=on, but the {self.name} kernel failed ({why}); "
                        "set it to auto or off"
                    ) from exc
                self.failed = True
                _log_once(f"fused decode kernel {self.name} failed ({why}); using its torch path from now on")
        return self.fallback(*args, **kwargs)


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.warning(message)


def _try(check: Callable[[torch.device], str | None], device: torch.device) -> str | None:
    """None when `check` passes; else what went wrong (its mismatch, or the exception compiling it)."""
    try:
        return check(device)
    except Exception as exc:  # a compiler or driver error of any kind means: use the torch path
        return (
            f"failed to compile or run ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        )


def _check_norm(device: torch.device) -> str | None:
    gen = torch.Generator(device="cpu").manual_seed(0)
    x, res = (torch.randn(3, 1, 67, generator=gen).to(device, torch.bfloat16) for _ in range(2))
    weight = torch.randn(67, generator=gen).to(device, torch.bfloat16)
    got, want = add_rms_norm_triton(x, res, weight, 1e-6), add_rms_norm_torch(x, res, weight, 1e-6)
    bad = any(
        not torch.allclose(g.float(), w.float(), rtol=2e-2, atol=2e-2) for g, w in zip(got, want, strict=True)
    )
    return "disagrees with its torch path on a check input" if bad else None


def _check_rope(device: torch.device) -> str | None:
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = 2
    heads = 4
    kv_heads = 2
    head_dim = 64
    q = torch.randn(rows, heads, 1, head_dim, generator=gen).to(device)
    k, v = (torch.randn(rows, kv_heads, 1, head_dim, generator=gen).to(device) for _ in range(2))
    cos = torch.randn(rows, 1, 1, head_dim, generator=gen).to(device)
    sin = signed_sin(torch.randn(rows, 1, 1, head_dim, generator=gen).to(device))
    lengths = torch.tensor([0, 3], device=device)
    caches = [
        (
            torch.zeros(rows, kv_heads, head_dim, 8, device=device),
            torch.zeros(rows, kv_heads, 8, head_dim, device=device),
        )
        for _ in range(2)
    ]
    got = rope_cache_triton(q, k, v, cos, sin, *caches[0], lengths)
    want = rope_cache_torch(q, k, v, cos, sin, *caches[1], lengths)
    same = torch.allclose(got, want, atol=1e-5) and all(
        torch.allclose(a, b, atol=1e-5) for a, b in zip(caches[0], caches[1], strict=True)
    )
    return None if same else "disagrees with its torch path on a check input"


def _check_sample(device: torch.device) -> str | None:
    gen = torch.Generator(device="cpu").manual_seed(0)
    logits = torch.randn(4, 300, generator=gen).to(device)
    rows = RowSampling(
        temperature=torch.tensor([0.0, 1.0, 0.7, 1.3], device=device),
        top_k=torch.tensor([0, 0, 20, 0], device=device),
        top_p=torch.tensor([1.0, 1.0, 1.0, 0.8], device=device),
        any_filter=True,
        any_greedy=True,
        all_greedy=False,
    )
    uniforms = torch.tensor([0.5, 0.31, 0.77, 0.05], device=device)
    got_t, got_lp = sample_triton(logits, rows, uniforms)
    want_t, want_lp = sample_torch(logits, rows, uniforms)
    assert got_lp is not None and want_lp is not None
    same = torch.equal(got_t, want_t) and torch.allclose(got_lp, want_lp, atol=1e-4)
    return None if same else "disagrees with its torch path on a check input"
