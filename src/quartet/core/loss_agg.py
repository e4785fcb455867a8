"""Reduction of a per-token loss matrix to the scalar that goes to backward.

For per-token losses l[i, t], a mask m[i, t] (1 = token written by the model), sequences S = rows with at
least one valid token, n_i = sum_t m[i, t], and the five modes of `LossAggMode`:

    token-mean               L = sum_{i,t} m l / N_tok,  N_tok = sum_{i,t} m         (DAPO; verl's default)
    seq-mean-token-sum       L = sum_{i in S} (sum_t m l) / N_seq,  N_seq = |S|
    seq-mean-token-mean      L = sum_{i in S} (sum_t m l / n_i) / N_seq              (GRPO paper)
    seq-mean-token-sum-norm  L = sum_{i in S} (sum_t m l) / (C N_seq), C constant    (Dr.GRPO)
    token-sum                L = sum_{i,t} m l                                       (verl's token-sum)

`token-sum` has no denominator: the loss (and its gradient) grows with the number of tokens, so the
learning rate must be tuned for the batch's token count; micro-batch values sum to the big batch's.

Gradient accumulation and data parallelism. Every other mode is a SUM over tokens or sequences divided by a
denominator. If the caller passes the denominator of the whole mini-batch (`global_token_count` = N_tok or
`global_seq_count` = N_seq, counted over all micro-batches and all ranks, see `count_valid_tokens` /
`count_valid_sequences`) the returned value is this micro-batch's share, and the shares SUM to the loss of
one big batch, so gradients accumulated by summing are exactly those of the big batch. Without them, the
denominators are local (what verl computes per micro-batch), which weights a micro-batch with few tokens as
much as one with many. Data-parallel wrappers (DDP, FSDP) AVERAGE gradients over ranks, so a caller that
uses global counts over ranks multiplies the loss by the data-parallel world size before backward.

Where verl 0.9.1 stands:
- Sequences without any valid token are not counted in N_seq and contribute 0, as in verl 0.9.1 (its
  seq-mean modes mask such rows out of the sequence count). Padding rows added to balance ranks therefore
  do not dilute the loss. (Older verl releases averaged over all rows; the rule here is verl 0.9.1's.)
- Dr.GRPO's constant C defaults to the mask's width T, as in verl; pass the configured maximum response
  length as `norm_constant` so micro-batches trimmed to different widths use the same C. Like verl 0.9.1,
  seq-mean-token-sum-norm divides by N_seq and by C.
- Departure: an empty micro-batch (no valid token) gives a loss of exactly 0 that is still connected to
  the graph (denominators are clamped at 1; verl's local token-mean would divide 0 by 0).
"""

from __future__ import annotations

import torch

from quartet.core.choices import LossAggMode

__all__ = ["aggregate_loss", "count_valid_sequences", "count_valid_tokens"]


def count_valid_tokens(mask: torch.Tensor) -> int:
    """Valid tokens of a [B, T] mask: the `global_token_count` contribution of one micro-batch."""
    return int((mask != 0).sum())


def count_valid_sequences(mask: torch.Tensor) -> int:
    """Rows of a [B, T] mask with at least one valid token: the `global_seq_count` contribution."""
    return int((mask != 0).any(dim=-1).sum())


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggMode,
    *,
    global_token_count: float | int | torch.Tensor | None = None,
    global_seq_count: float | int | torch.Tensor | None = None,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to a scalar (see the module docstring for the formulas).

    Args:
        loss_mat: [B, T] per-token losses (any float dtype; gradients flow through it).
        mask: [B, T] bool or 0/1; only non-zero positions contribute (a NaN at a masked position does not
            leak: positions are selected out, not multiplied by 0).
        mode: the reduction.
        global_token_count: N_tok of the whole mini-batch (all micro-batches, all ranks) for `token-mean`;
            None uses this micro-batch's count.
        global_seq_count: N_seq of the whole mini-batch for the three `seq-mean-*` modes; None: local.
        norm_constant: C of `seq-mean-token-sum-norm`; None uses T = loss_mat.shape[-1].

    Returns:
        A 0-d tensor in loss_mat's dtype.
    """
    mode = LossAggMode(mode)  # a member of another StrEnum with the same value (config) is accepted
    valid = mask if mask.dtype == torch.bool else mask != 0
    zero = torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device)
    kept = torch.where(valid, loss_mat, zero)
    if mode is LossAggMode.TOKEN_SUM:
        return kept.sum()
    token_sums = kept.sum(dim=-1)  # [B]
    if mode is LossAggMode.TOKEN_MEAN:
        denom = _denominator(global_token_count, valid.sum(), loss_mat)
        return kept.sum() / denom
    n_seq = _denominator(global_seq_count, valid.any(dim=-1).sum(), loss_mat)
    if mode is LossAggMode.SEQ_MEAN_TOKEN_SUM:
        return token_sums.sum() / n_seq
    if mode is LossAggMode.SEQ_MEAN_TOKEN_MEAN:
        lengths = valid.sum(dim=-1).clamp(min=1).to(loss_mat.dtype)
        return (token_sums / lengths).sum() / n_seq
    if mode is LossAggMode.SEQ_MEAN_TOKEN_SUM_NORM:
        constant = float(loss_mat.shape[-1]) if norm_constant is None else float(norm_constant)
        if constant <= 0:
            raise ValueError(f"norm_constant must be > 0, got {constant}")
        return token_sums.sum() / (n_seq * constant)
    raise ValueError(f"unknown loss aggregation mode {mode!r}")


def _denominator(
    given: float | int | torch.Tensor | None, local: torch.Tensor, like: torch.Tensor
) -> torch.Tensor:
    """The global count if given, else the local one; never below 1 so an empty batch gives 0, not NaN."""
    count = local if given is None else torch.as_tensor(given, device=like.device)
    return count.to(like.dtype).clamp(min=1.0)
