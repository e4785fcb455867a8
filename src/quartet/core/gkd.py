"""GKD's generalised Jensen-Shannon divergence over the teacher's top-k tokens (Agarwal et al., 2024).

At each response position the teacher's k most likely next tokens form the support. Over it the teacher's
log-probs t and the student's s (at the same ids) are renormalised to distributions P (teacher) and Q
(student); the tail outside the top k is dropped (with k the whole vocabulary this is the full divergence).
Then, for beta in [0, 1]:

    M = beta P + (1 - beta) Q
    JSD_beta(P || Q) = beta KL(P || M) + (1 - beta) KL(Q || M)

and at the ends, as GKD and TRL's `GKDTrainer` define them (the formula itself is 0 there):

    beta = 0: KL(P || Q)   the forward KL (mode-covering: supervised KD on the student's samples)
    beta = 1: KL(Q || P)   the reverse KL over the support (mode-seeking)

beta = 0.5 is the symmetric Jensen-Shannon divergence. The loss term is `coef x aggregate(JSD)` over
model-written tokens with the actor's loss aggregation, differentiable in the student's log-probs only (the
teacher is a constant). It sits beside the policy loss, whose advantages may carry the per-token reverse
KL of `core.distill` and the task reward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from quartet.core.choices import LossAggMode
from quartet.core.loss_agg import aggregate_loss

__all__ = [
    "GKD_JSD",
    "TEACHER_TOPK_IDS",
    "TEACHER_TOPK_LOGPROBS",
    "GkdLossOutput",
    "generalized_jsd",
    "gkd_loss_term",
]

GKD_JSD = "distill/gkd_jsd"
TEACHER_TOPK_IDS = "teacher_topk_ids"
"""Batch column [B, R, k] int64: the teacher's top-k token ids per response position."""
TEACHER_TOPK_LOGPROBS = "teacher_topk_logprobs"
"""Batch column [B, R, k] float32: their log-probs under the teacher (the rollout's temperature)."""


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dimension from log-probs (terms with p = 0 add 0)."""
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)


def generalized_jsd(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float
) -> torch.Tensor:
    """[...] float32: JSD_beta(teacher || student) per position over the last dimension (the support), both
    renormalised over it (module doc)."""
    if student_logprobs.shape != teacher_logprobs.shape:
        raise ValueError(
            f"student {tuple(student_logprobs.shape)} and teacher {tuple(teacher_logprobs.shape)} log-probs "
            "must have one shape [..., k]"
        )
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"the GKD beta must lie in [0, 1], got {beta}")
    s = torch.log_softmax(student_logprobs.float(), dim=-1)
    t = torch.log_softmax(teacher_logprobs.float(), dim=-1).detach()
    if beta == 0.0:
        return _kl(t, s)
    if beta == 1.0:
        return _kl(s, t)
    m = torch.logaddexp(t + math.log(beta), s + math.log(1.0 - beta))
    return beta * _kl(t, m) + (1.0 - beta) * _kl(s, m)


@dataclass(frozen=True)
class GkdLossOutput:
    """The weighted loss term and its metric (`distill/gkd_jsd`: the aggregated JSD before the weight)."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]


def gkd_loss_term(
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    coef: float,
    *,
    agg_mode: LossAggMode = LossAggMode.TOKEN_MEAN,
    global_token_count: float | int | torch.Tensor | None = None,
    global_seq_count: float | int | torch.Tensor | None = None,
    norm_constant: float | None = None,
) -> GkdLossOutput:
    """coef x aggregate(JSD_beta) over the positions of `response_mask` [B, T]; log-probs [B, T, k] at the
    teacher's top-k ids. Aggregation arguments: see `loss_agg.aggregate_loss`."""
    per_token = generalized_jsd(student_logprobs, teacher_logprobs, beta)
    value = aggregate_loss(
        per_token,
        response_mask,
        agg_mode,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        norm_constant=norm_constant,
    )
    return GkdLossOutput(coef * value, {GKD_JSD: value.detach()})
