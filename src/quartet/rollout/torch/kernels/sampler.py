"""The decode step's sampler (temperature, top-k, top-p, the inverse-CDF draw, the log-prob) in one kernel.

`quartet.rollout.torch.sampling.sample_next` defines the draw; this module computes the same token and
log-prob per row without a sort. The torch path sorts each row (a device-wide sort and a cumsum, and a
searchsorted: several kernels and a [A, V] temporary per step); here one program per row makes passes over
its logits instead:

- the ranked order `sample_next` walks for a row with top-k or top-p is the order of (scaled logit descending,
  vocab index ascending): `sample_next` sorts stably, so equal logits keep index order. That is the tie
  rule, at the top-k cut, the top-p cut and the draw alike. Each token gets a 56-bit key that is
  monotone in that order (the float's order-preserving integer, then the complemented index), so "the
  k-th token", "the last token whose preceding mass is below top_p" and "the first token whose
  cumulative mass exceeds u * total" are each the largest key with a monotone property: found bit by bit,
  one pass over the row per bit, without materialising the sorted row.
- a row without a filter walks the vocabulary in index order (as `sample_next` does), one chunked
  cumulative sum, whatever the other rows of its batch do.

Masses are summed in a different order than torch's cumsum, so a token can differ from `sample_next` only
when `u * total` lies within float32 rounding of a cumulative boundary (about 1e-7 of the mass); tests
avoid such draws by construction. The log-prob is log_softmax(logits / T) at the token, as there.
Vocabularies up to 2**24 tokens.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from quartet.rollout.torch.sampling import RowSampling, sample_next

__all__ = ["RANKED_KERNEL", "sample_fused", "sample_torch", "sample_triton"]

_INDEX_BITS = 24  # low bits of a key: the complemented vocab index
_KEY_BITS = 32 + _INDEX_BITS
_CHUNK = 4096  # vocab entries a program reads per inner iteration (16 warps: 8 each per thread)
RANKED_KERNEL = False
"""Whether the engine's fused sampler (`sample_fused`) runs filtering batches through the kernel. Off until a
device run measures it: its threshold searches make ~170 passes over each row (56 per search), against
one sort on the torch path; `benchmarks/gpu/goal_decode_kernels.py` times both (`sample_top_k_top_p`)."""


def sample_torch(
    logits: torch.Tensor, rows: RowSampling, uniforms: torch.Tensor, want_logprobs: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The torch path: `sample_next` itself."""
    return sample_next(logits, rows, uniforms, want_logprobs)


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, imported on first use (Triton is optional; `TRITON_INTERPRET` is read then)."""
    from quartet.rollout.torch.kernels.sampler_triton import sampler_kernel

    return sampler_kernel


def sample_fused(
    logits: torch.Tensor, rows: RowSampling, uniforms: torch.Tensor, want_logprobs: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The engine's sampler where the kernel is selected: the kernel for batches without top-k/top-p (three
    passes over each row), and for filtering ones too when `RANKED_KERNEL` is set; else `sample_next`."""
    if rows.any_filter and not rows.all_greedy and not RANKED_KERNEL:
        return sample_next(logits, rows, uniforms, want_logprobs)
    return sample_triton(logits, rows, uniforms, want_logprobs)


def sample_triton(
    logits: torch.Tensor, rows: RowSampling, uniforms: torch.Tensor, want_logprobs: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sample_next` as one Triton launch (one program per row); same arguments, same results.

    logits [A, V] (any float dtype, read as float32; rows may be strided, entries contiguous).
    """
    count, vocab = logits.shape
    if vocab >= 1 << _INDEX_BITS:
        raise ValueError(f"sample_triton: vocabularies up to {1 << _INDEX_BITS} tokens, got {vocab}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    tokens = torch.empty(count, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(count, dtype=torch.float32, device=logits.device)
    if count:
        ranked = rows.any_filter and not rows.all_greedy
        block = min(_CHUNK, 1 << max(vocab - 1, 0).bit_length())
        _kernel()[(count,)](
            logits, logits.stride(0), rows.temperature.float().contiguous(), rows.top_k.contiguous(),
            rows.top_p.float().contiguous(), uniforms.float().contiguous(), tokens, logprobs, vocab,
            1 << (_KEY_BITS - 1), RANKED=ranked, BLOCK=block, SPAN=-(-vocab // block) * block,
            INDEX_BITS=_INDEX_BITS, KEY_BITS=_KEY_BITS, num_warps=16 if block >= _CHUNK else 4,
        )  # fmt: skip
    return tokens, logprobs if want_logprobs else None
