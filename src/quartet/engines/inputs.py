"""Model inputs of a micro-batch, with the padding that no row of it needs trimmed away.

A Batch row is a left-padded prompt [P] followed by a right-padded response [R], `attention_mask` [P+R]
marking real tokens. The model sees the concatenation with position ids cumsum(attention_mask) - 1
(clamped at 0), so a token's position does not depend on how much padding precedes it; padded keys are
masked out of attention. Hence columns that are padding in EVERY row of a micro-batch can be dropped
without changing any real token's output: the leading prompt columns before the longest prompt, and the
response columns after the longest response. Micro-batches of short rows then cost less, and results are
the same however rows are grouped (up to floating-point reduction order, see tests/engines).

A row with an empty prompt keeps one prompt column: the log-prob of response token 0 is read from the
logits at prompt position P - 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quartet.core.batch import Batch
from quartet.core.routing import ROUTED_EXPERTS

__all__ = ["ModelInputs", "build_inputs", "pad_responses", "valid_lengths"]


@dataclass(frozen=True)
class ModelInputs:
    """Trimmed model inputs of b rows; T = kept prompt columns + `response_width`."""

    input_ids: torch.Tensor
    """[b, T] int64."""

    attention_mask: torch.Tensor
    """[b, T] int64 (1 = real token)."""

    position_ids: torch.Tensor
    """[b, T] int64."""

    response_width: int
    """R' <= R: response columns kept (the longest response of the micro-batch, at least 1)."""

    response_mask: torch.Tensor
    """[b, R'] bool: response tokens that are attended (real), i.e. where outputs are defined."""

    routing: torch.Tensor | None = None
    """[b, T, L, k] the MoE routing the rollout engine recorded (`routed_experts`, trimmed like the ids);
    None when the batch carries none."""


def valid_lengths(batch: Batch) -> torch.Tensor:
    """[B] real tokens (prompt + response) of each row, from `attention_mask`."""
    mask: torch.Tensor = batch["attention_mask"]
    return mask.sum(dim=-1).to(torch.int64)


def build_inputs(batch: Batch, trim: bool = True) -> ModelInputs:
    """Concatenated prompt + response ids, mask and position ids of `batch`, trimmed of shared padding.

    Uses `position_ids` [B, P+R] from the batch when present, else cumsum(attention_mask) - 1 clamped at 0.
    """
    prompts, responses = batch["prompts"], batch["responses"]
    p_len, r_len = prompts.shape[1], responses.shape[1]
    mask = batch["attention_mask"].to(torch.int64)
    if mask.shape[1] != p_len + r_len:
        raise ValueError(
            f"attention_mask has {mask.shape[1]} columns, prompts + responses have {p_len + r_len}"
        )
    if p_len == 0:
        raise ValueError("prompts have no column: the first response token needs a prompt position")
    ids = torch.cat([prompts, responses], dim=1)
    start, width = 0, r_len
    if trim and len(batch):
        attended = mask.any(dim=0)
        prompt_cols = attended[:p_len].nonzero()
        start = min(int(prompt_cols[0]) if prompt_cols.numel() else p_len - 1, p_len - 1)
        resp_cols = attended[p_len:].nonzero()
        width = max(int(resp_cols[-1]) + 1 if resp_cols.numel() else 0, 1) if r_len else 0
    stop = p_len + width
    ids, mask = ids[:, start:stop], mask[:, start:stop]
    if "position_ids" in batch:
        positions = batch["position_ids"][:, start:stop].to(torch.int64)
    else:
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    routing = batch[ROUTED_EXPERTS][:, start:stop] if ROUTED_EXPERTS in batch else None
    return ModelInputs(ids, mask, positions, width, mask[:, p_len - start :] != 0, routing)


def pad_responses(values: torch.Tensor, width: int) -> torch.Tensor:
    """[b, R'] -> [b, width] with zeros on the right (differentiable)."""
    missing = width - values.shape[1]
    if missing < 0:
        raise ValueError(f"cannot pad {values.shape[1]} response columns down to {width}")
    return torch.nn.functional.pad(values, (0, missing)) if missing else values
