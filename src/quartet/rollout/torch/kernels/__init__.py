"""Fused decode kernels in Triton, each beside the torch path it replaces (`rollout.fused_kernels`).

One module per kernel (`rms_norm`: residual add + RMSNorm; `rope_cache`: RoPE with the KV-cache write;
`sampler`: temperature, top-k, top-p and the seeded draw) with its torch path and its launcher, its Triton
code beside it (`*_triton`, imported only when the kernel is first used, so nothing else here needs
Triton), and `available`, which picks per device the Triton kernel or the torch path.
"""

from quartet.rollout.torch.kernels.available import (
    FUSED_KERNEL_MODES,
    DecodeKernels,
    GuardedKernel,
    KernelsUnavailableError,
    select_kernels,
    torch_kernels,
    triton_kernels,
    triton_missing,
)

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
