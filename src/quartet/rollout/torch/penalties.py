"""Logit processing before sampling: repetition, frequency and presence penalties, and `min_tokens`.

For row r with prompt tokens P, generated tokens G so far, and c[v] = count of v in G (vLLM's order):

    l[v] <- l[v] / rep   if v in P or G and l[v] > 0
    l[v] <- l[v] * rep   if v in P or G and l[v] <= 0           (vLLM's / transformers' repetition penalty)
    l[v] <- l[v] - freq * c[v] - pres * [c[v] > 0]              (OpenAI's frequency and presence penalties)
    l[v] <- -inf         for v in the stop ids while |G| < min_tokens

Applied to the raw logits, before temperature, top-k and top-p, for the whole batch at once. Only the
(row, token) entries a penalty touches change, so the work is done on those entries alone: the host lists
them for every penalised row (the distinct tokens of its prompt and response, with counts), and one gather
and one indexed write apply the formulas above to all of them. That is O(prompt + response) per penalised
row and step instead of passes over [A, V] (V is 150k for Qwen), and needs no per-slot [slots, V] state to
allocate and move at compaction. Rows that use none of these are left untouched, bit for bit; with no
such row in the batch nothing here runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quartet.rollout.torch.sequence import SequenceState

__all__ = ["LogitProcessing", "apply_processing", "build_processing"]


@dataclass
class LogitProcessing:
    """The logit entries to change, as K flat (row, token) pairs, on the logits' device.

    rows, tokens [K] int64: distinct entries, each a token in the prompt (when the row has a repetition
    penalty) or the response of that row; counts [K] float32: times the token was generated;
    repetition, frequency, presence [A] float32: each row's penalties (1, 0, 0 = off);
    banned_rows, banned_tokens [B] int64: entries masked to -inf (stop ids of rows under `min_tokens`).
    """

    rows: torch.Tensor
    tokens: torch.Tensor
    counts: torch.Tensor
    repetition: torch.Tensor
    frequency: torch.Tensor
    presence: torch.Tensor
    banned_rows: torch.Tensor
    banned_tokens: torch.Tensor


def build_processing(
    seqs: Sequence[SequenceState], vocab: int, device: torch.device
) -> LogitProcessing | None:
    """The processing of rows `seqs` (row i = seqs[i]); None when no row uses a penalty or `min_tokens`."""
    if not any(s.request.sampling.uses_penalties for s in seqs):
        return None
    rows: list[int] = []
    tokens: list[int] = []
    counts: list[float] = []
    banned: list[tuple[int, int]] = []
    for i, seq in enumerate(seqs):
        p = seq.request.sampling
        if len(seq.token_ids) < p.min_tokens:
            banned += [(i, t) for t in sorted(seq.stop_ids) if 0 <= t < vocab]
        if p.presence_penalty == 0.0 and p.frequency_penalty == 0.0 and p.repetition_penalty == 1.0:
            continue
        generated = Counter(seq.token_ids)
        seen = set(generated)
        if p.repetition_penalty != 1.0:
            seen |= seq.prompt_token_set
        entries = sorted(t for t in seen if 0 <= t < vocab)
        rows += [i] * len(entries)
        tokens += entries
        counts += [float(generated.get(t, 0)) for t in entries]

    def ints(xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.long).to(device)

    def floats(xs: list[float]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.float32).to(device)

    params = [s.request.sampling for s in seqs]
    return LogitProcessing(
        rows=ints(rows),
        tokens=ints(tokens),
        counts=floats(counts),
        repetition=floats([p.repetition_penalty for p in params]),
        frequency=floats([p.frequency_penalty for p in params]),
        presence=floats([p.presence_penalty for p in params]),
        banned_rows=ints([r for r, _ in banned]),
        banned_tokens=ints([t for _, t in banned]),
    )


def apply_processing(logits: torch.Tensor, proc: LogitProcessing) -> torch.Tensor:
    """Processed logits [A, V] float32 of raw logits [A, V] (see the module docstring); a new tensor."""
    out = logits.float()
    if out is logits:  # float32 already: copy, the caller's logits stay as they were
        out = out.clone()
    vocab, flat = out.shape[-1], out.view(-1)  # entries addressed as row * V + token: 1-D gathers are fast
    if proc.rows.numel():
        index = proc.rows * vocab + proc.tokens
        rep, freq, pres = (
            t.index_select(0, proc.rows) for t in (proc.repetition, proc.frequency, proc.presence)
        )
        x = flat.index_select(0, index)
        x = torch.where(x > 0, x / rep, x * rep)
        x = x - freq * proc.counts - pres * (proc.counts > 0).float()
        flat.index_copy_(0, index, x)
    if proc.banned_rows.numel():
        flat.index_fill_(0, proc.banned_rows * vocab + proc.banned_tokens, float("-inf"))
    return out
