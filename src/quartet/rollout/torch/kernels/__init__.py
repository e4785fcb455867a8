"""Fused decode kernels in Triton, each beside the torch path it replaces (`rollout.fused_kernels`).

One module per kernel (`rms_norm`: residual add + RMSNorm; `rope_cache`: RoPE with the KV-cache write;
`sampler`: temperature, top-k, top-p and the seeded draw), and `available` picks, per device, the Triton
kernel or the torch path. Triton is imported only when a kernel is first used, so nothing here needs it.
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
