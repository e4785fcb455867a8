"""Prompt log-probs (vLLM's `prompt_logprobs`): how likely the model finds each token of a prompt it reads.

A prefill already computes the hidden state of every prompt position; only the last one usually goes
through the head. For a request with `GenerationRequest.prompt_logprobs` = k, the engine sends the others
through it too: position t's logits score token t + 1. Each scored token gets its log-prob under the raw
model (log_softmax(logits), temperature 1, no penalties: vLLM's choice too, so a caller gets the same
numbers from either server), its rank, and the k most likely tokens there. The first token has no score.

What it is for: a teacher (on-policy distillation) or a judge scores given tokens without sampling them.
The head runs over `CHUNK` positions at a time, so a long prompt never holds [P, V] float32 logits at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from quartet.rollout.types import PromptLogprob

__all__ = ["CHUNK", "score_prompt"]

CHUNK = 512
"""Prompt positions sent through the head at once."""


def score_prompt(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    prompt: Sequence[int],
    k: int,
) -> tuple[PromptLogprob | None, ...]:
    """Per token of `prompt` [P] its `PromptLogprob` (None for the first), from the hidden states [>= P, D]
    of a prefill of it (`head` maps hidden states [n, D] to logits [n, V])."""
    targets = torch.as_tensor(list(prompt)[1:], dtype=torch.long, device=hidden.device)
    scored: list[PromptLogprob | None] = [None]
    for start in range(0, len(targets), CHUNK):
        stop = min(start + CHUNK, len(targets))
        logprobs = torch.log_softmax(head(hidden[start:stop]).float(), dim=-1)
        chosen = logprobs.gather(-1, targets[start:stop, None])
        ranks = (logprobs > chosen).sum(-1) + 1
        if k > 0:
            top_values, top_ids = logprobs.topk(k, dim=-1)
            tops = list(zip(top_ids.tolist(), top_values.tolist(), strict=True))
        else:
            tops = [([], [])] * (stop - start)
        for token, value, rank, (ids, values) in zip(
            targets[start:stop].tolist(), chosen[:, 0].tolist(), ranks.tolist(), tops, strict=True
        ):
            scored.append(PromptLogprob(token, value, rank, tuple(zip(ids, values, strict=True))))
    return tuple(scored)
