"""The causal LM head's call in a forward pass: the sampled tokens' log-probs and entropy, and on request
the top-k of each position's distribution or the log-probs at given ids (GKD, `engines.support_head`).

The fused head (`engines.fused_head`) computes all of them from the hidden states inside the model's
forward; the plain head from the kept logits [b, K, V]; the vocabulary-parallel head (tensor parallelism)
computes the sampled tokens' outputs only: top-k and support over vocabulary shards are not built, and
asking for them there raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from quartet.core.batch import Batch
from quartet.engines import heads
from quartet.engines.fused_head import HeadRequest, fused_lm_head
from quartet.engines.support_head import support_from_logits, topk_from_logits
from quartet.engines.tensor_parallel import VocabHead

__all__ = ["NO_EXTRAS", "ExtraOutputs", "ExtrasUnsupported", "extra_outputs", "head_request", "run_head"]


class ExtrasUnsupported(RuntimeError):
    """Top-k or support log-probs asked of a pass that cannot compute them (packed, vocabulary-parallel)."""


@dataclass(frozen=True)
class ExtraOutputs:
    """Per-position outputs beyond the sampled token's, asked of a causal LM pass."""

    top_k: int = 0
    """> 0: `ModelOutputs.topk_logprobs` and `topk_ids` [B, R, k] (no gradient)."""
    support_key: str | None = None
    """A batch column [B, R, k] of token ids: `ModelOutputs.support_logprobs` at them (with graph)."""

    @property
    def wanted(self) -> bool:
        return self.top_k > 0 or self.support_key is not None


NO_EXTRAS = ExtraOutputs()


def head_request(
    mb: Batch,
    targets: torch.Tensor,
    temperature: float,
    grads: tuple[bool, bool],
    extras: ExtraOutputs,
) -> HeadRequest:
    """The request of one micro-batch whose `targets` [b, R'] are its first R' response columns; `grads` is
    (with_entropy, entropy_grad)."""
    support = None
    if extras.support_key is not None:
        support = mb[extras.support_key][:, : targets.shape[1]].to(targets.device)
    return HeadRequest(targets, temperature, *grads, top_k=extras.top_k, support=support)


def run_head(
    forward: Callable[[bool], torch.Tensor],
    request: HeadRequest,
    lm_head: nn.Linear | None,
    vocab: VocabHead | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [b, K] and entropy (or None) of `request.targets` [b, K] at the positions `forward(fused)`
    keeps; the top-k and support asked for go into `request.side`.

    Fused: the lm_head computes them from the hidden states block by block. Plain: the model returns the
    kept logits [b, K, V] and `heads` takes their float32 log-softmax in chunks."""
    targets = request.targets
    if lm_head is not None:
        with fused_lm_head(lm_head, request):
            both = forward(True)  # [b, K, 2]
        return both[..., 0], both[..., 1] if request.with_entropy else None
    logits = forward(False)
    if vocab is not None:  # this rank's vocabulary slice of the logits
        if request.top_k or request.support is not None:
            raise ExtrasUnsupported(
                "top-k and support log-probs (GKD) are not built for the vocabulary-parallel head "
                "(model.tensor_parallel_size > 1)"
            )
        return vocab.outputs(logits, targets, request)
    logprobs = heads.response_logprobs(logits, targets, request.temperature)
    entropy = None
    if request.with_entropy:
        with torch.set_grad_enabled(torch.is_grad_enabled() and request.entropy_grad):
            entropy = heads.response_entropy(logits, request.temperature)
    if request.top_k:
        values, ids = topk_from_logits(logits, request.top_k, request.temperature)
        request.side["topk_logprobs"] = values
        request.side["topk_ids"] = ids
    if request.support is not None:
        request.side["support_logprobs"] = support_from_logits(logits, request.support, request.temperature)
    return logprobs, entropy


def extra_outputs(request: HeadRequest, valid: torch.Tensor, full: int) -> dict[str, torch.Tensor]:
    """`ModelOutputs` fields of the extras in `request.side`: [b, R', k] zeroed where `valid` [b, R'] is
    False and padded to `full` response columns."""

    def finish(t: torch.Tensor) -> torch.Tensor:
        kept = torch.where(valid.unsqueeze(-1), t, torch.zeros((), dtype=t.dtype, device=t.device))
        return torch.nn.functional.pad(kept, (0, 0, 0, full - t.shape[1]))

    return {field: finish(value) for field, value in request.side.items()}
