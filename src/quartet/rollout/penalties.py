"""Logit processing before sampling: repetition, frequency and presence penalties, and `min_tokens`.

For row r with prompt tokens P, generated tokens G so far, and c[v] = count of v in G (vLLM's order):

    l[v] <- l[v] / rep   if v in P or G and l[v] > 0
    l[v] <- l[v] * rep   if v in P or G and l[v] <= 0           (vLLM's / transformers' repetition penalty)
    l[v] <- l[v] - freq * c[v] - pres * [c[v] > 0]              (OpenAI's frequency and presence penalties)
    l[v] <- -inf         for v in the stop ids while |G| < min_tokens

Applied to the raw logits, before temperature, top-k and top-p, for every row of the batch at once.
The token counts are rebuilt each step from the host's token lists (a padded [A, L] id tensor scattered
into [A, V]): no per-slot [slots, V] state to allocate, move at compaction and keep in sync, at the cost
of O(A * (prompt + response)) host work per step, paid only while some running row uses a penalty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quartet.rollout.sequence import SequenceState

__all__ = ["LogitProcessing", "apply_processing", "build_processing", "token_counts"]


@dataclass
class LogitProcessing:
    """Per-row processing of A rows over a vocabulary of V, on the logits' device.

    presence, frequency, repetition [A] float32 (0, 0, 1 = off); output_counts [A, V] float32: times each
    token was generated; seen [A, V] bool: token in the prompt or generated; banned_rows, banned_tokens [K]
    int64: (row, token) pairs masked to -inf (stop ids of rows still under `min_tokens`).
    """

    presence: torch.Tensor
    frequency: torch.Tensor
    repetition: torch.Tensor
    output_counts: torch.Tensor
    seen: torch.Tensor
    banned_rows: torch.Tensor
    banned_tokens: torch.Tensor


def token_counts(rows: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """counts [len(rows), vocab] float32: how often each id occurs in each row (ids >= vocab ignored)."""
    longest = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), longest + 1), vocab, dtype=torch.long)  # column `vocab` collects padding
    for i, r in enumerate(rows):
        if r:
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    ids = ids.clamp_(max=vocab).to(device)
    counts = torch.zeros(len(rows), vocab + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, ids, torch.ones(ids.shape, dtype=torch.float32, device=device))
    return counts[:, :vocab]


def build_processing(
    seqs: Sequence[SequenceState], vocab: int, device: torch.device
) -> LogitProcessing | None:
    """The processing of rows `seqs` (row i = seqs[i]); None when no row uses a penalty or `min_tokens`."""
    params = [s.request.sampling for s in seqs]
    if not any(p.uses_penalties for p in params):
        return None
    counted = [
        p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0 for p in params
    ]
    outputs = [s.token_ids if c else [] for s, c in zip(seqs, counted, strict=True)]
    prompts = [
        s.request.prompt_token_ids if p.repetition_penalty != 1.0 else ()
        for s, p in zip(seqs, params, strict=True)
    ]
    output_counts = token_counts(outputs, vocab, device)
    seen = (output_counts > 0) | (token_counts(prompts, vocab, device) > 0)
    banned = [
        (i, t)
        for i, (s, p) in enumerate(zip(seqs, params, strict=True))
        if len(s.token_ids) < p.min_tokens
        for t in sorted(s.stop_ids)
        if 0 <= t < vocab
    ]

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32).to(device)

    return LogitProcessing(
        presence=column([p.presence_penalty for p in params]),
        frequency=column([p.frequency_penalty for p in params]),
        repetition=column([p.repetition_penalty for p in params]),
        output_counts=output_counts,
        seen=seen,
        banned_rows=torch.tensor([i for i, _ in banned], dtype=torch.long).to(device),
        banned_tokens=torch.tensor([t for _, t in banned], dtype=torch.long).to(device),
    )


def apply_processing(logits: torch.Tensor, proc: LogitProcessing) -> torch.Tensor:
    """Processed logits [A, V] float32 of raw logits [A, V] (see the module docstring); a new tensor."""
    logits = logits.float()
    rep = proc.repetition.unsqueeze(1)
    repeated = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(proc.seen, repeated, logits)
    logits = logits - proc.frequency.unsqueeze(1) * proc.output_counts
    logits = logits - proc.presence.unsqueeze(1) * (proc.output_counts > 0).float()
    if proc.banned_rows.numel():
        logits[proc.banned_rows, proc.banned_tokens] = float("-inf")
    return logits
