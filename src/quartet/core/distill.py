"""On-policy distillation's learning signal: the per-token reverse KL to a teacher, as an advantage.

The student samples y ~ pi_s; a frozen teacher scores every sampled token. Per response token t of row i
(mask m = 1 on model-written tokens only, so tool and user turns get no teacher signal):

    d[i, t] = log pi_s(y_t | y_<t) - log pi_t(y_t | y_<t)     the per-token reverse-KL estimate
    A[i, t] = -(d[i, t] + gamma d[i, t+1] + gamma^2 d[i, t+2] + ...)   over model-written tokens only

With gamma = 0 (the published recipe: Agarwal et al. 2024's GKD on-policy, Thinking Machines' "On-Policy
Distillation", 2025) each token's advantage is minus its own reverse KL: tokens the teacher finds likelier
than the student are pushed up, the others down. The sum over the sequence of d is a single-sample estimate
of KL(pi_s || pi_t) over sequences (`distill/reverse_kl` reports its per-token mean). A teacher equal to the
student gives d = 0, so no signal.

The driver adds `algorithm.distill_coef` x A to the task reward's advantages, weighted by
`algorithm.distill_task_coef` (0: distillation alone); the policy loss, clipping, TIS and loss aggregation
then apply to the sum as to any advantage.
"""

from __future__ import annotations

import torch

from quartet.core.metrics import masked_mean

__all__ = ["distill_metrics", "reverse_kl_advantages"]


def reverse_kl_advantages(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor, gamma: float = 0.0
) -> torch.Tensor:
    """[B, T] float32: minus the discounted sum, from each model-written token on, of the per-token reverse
    KL `student - teacher` (module docstring); 0 where `mask` is 0. Environment tokens between model turns
    neither add to the sum nor break the discount's count (it runs over model-written tokens)."""
    if student_logprobs.shape != teacher_logprobs.shape or student_logprobs.shape != mask.shape:
        raise ValueError(
            f"student {tuple(student_logprobs.shape)}, teacher {tuple(teacher_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} log-probs must have one shape [B, T]"
        )
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"the distillation discount must lie in [0, 1], got {gamma}")
    keep = mask.to(torch.float32)
    per_token = (student_logprobs.float() - teacher_logprobs.float()) * keep
    if gamma == 0.0:
        return -per_token
    out = torch.zeros_like(per_token)
    running = torch.zeros(per_token.shape[0], dtype=torch.float32)
    for t in range(per_token.shape[1] - 1, -1, -1):  # a model-written token discounts what follows it
        on = keep[:, t] > 0
        running = torch.where(on, per_token[:, t] + gamma * running, running)
        out[:, t] = torch.where(on, -running, torch.zeros_like(running))
    return out


def distill_metrics(
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    teacher_agrees: torch.Tensor | None = None,
) -> dict[str, float]:
    """`distill/reverse_kl` (mean over model-written tokens of student - teacher log-prob),
    `distill/teacher_logprob` and `distill/student_logprob` (their means), `distill/seq_reverse_kl` (the
    mean over rows of each row's sum); with `teacher_agrees` [B, T] (1 where the teacher's most likely
    token is the sampled one), `distill/teacher_argmax_agree`: its mean over model-written tokens."""
    keep = mask.to(torch.float32)
    diff = (student_logprobs.float() - teacher_logprobs.float()) * keep
    rows = keep.sum(-1) > 0
    agree = (
        {}
        if teacher_agrees is None
        else {"distill/teacher_argmax_agree": float(masked_mean(teacher_agrees.float(), keep))}
    )
    return agree | {
        "distill/reverse_kl": float(masked_mean(diff, keep)),
        "distill/teacher_logprob": float(masked_mean(teacher_logprobs.float(), keep)),
        "distill/student_logprob": float(masked_mean(student_logprobs.float(), keep)),
        "distill/seq_reverse_kl": float(diff.sum(-1)[rows].mean()) if bool(rows.any()) else 0.0,
    }
