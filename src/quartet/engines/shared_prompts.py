"""Rows of a packed micro-batch that share their prompt run it once (`model.shared_prompts`).

GRPO and its kin sample n responses per prompt, so a micro-batch holds each prompt n times, and the packed
path (`engines.packing`) runs every copy through every layer, forward and backward. Here the rows whose
prompts are the same (same real tokens at the same positions) form a group, packed as the prompt once and
then each row's response, the response positions continuing from the prompt as in its own row:

    [prompt | response 1 | response 2 | ... | response n]   one group, then the next

Attention runs over spans (`AttentionSpans`): the prompt attends causally to itself; each response attends
to its group's whole prompt and causally to itself, never to another response. A prompt token's hidden
states do not depend on anything after it (causal attention), so they are those of every copy; a response
token sees the keys it saw in its own row, at the same positions. The log-probs of the response tokens are
therefore the unshared ones up to float rounding, and so are the gradients: autograd sums what the n
responses send back into the shared prompt, as the sum of the n copies' gradients would
(tests/engines/test_shared_prompts.py). The update's cost drops by (n - 1) x the prompt tokens of a group.

A micro-batch without two rows of one prompt, or with a row whose prompt has no real token, packs as
before (`pack_inputs`). The response token j of a row is scored from the logits of the position before it:
for j = 0 that is the prompt's last token, shared by the group (its index appears n times in `keep`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from quartet.engines.varlen_kernel import kernel_attention

__all__ = ["AttentionSpans", "SharedLayout", "masked_span", "shared_layout_of", "span_attention"]


@dataclass(frozen=True)
class AttentionSpans:
    """Runs of queries of a packed sequence, in order, each with the keys it attends to.

    Span i's queries are the next `query_lengths[i]` positions; its keys are `key_lengths[i]` positions of
    `key_index` (span after span), ending with its own queries: a query attends to the keys before its own
    position among them (causal, aligned to the end)."""

    query_lengths: tuple[int, ...]
    key_index: torch.Tensor
    """[sum(key_lengths)] int64 positions in the packed sequence."""
    key_lengths: tuple[int, ...]

    def to(self, device: torch.device) -> AttentionSpans:
        """The same spans with `key_index` on `device`."""
        return replace(self, key_index=self.key_index.to(device))


@dataclass(frozen=True)
class SharedLayout:
    """The packed tokens of a shared-prompt micro-batch and where each row's columns went."""

    input_ids: torch.Tensor
    """[1, N] int64."""
    position_ids: torch.Tensor
    """[1, N] int64."""
    column_index: torch.Tensor
    """[b, T] packed index of each row's last real token at or before each column (-1 before any)."""
    spans: AttentionSpans


def prompt_groups(ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> list[list[int]] | None:
    """Rows grouped by their prompt (real tokens and positions), groups in order of first appearance;
    None when no two rows share one or some row's prompt has no real token."""
    groups: dict[tuple[bytes, bytes], list[int]] = {}
    for row in range(ids.shape[0]):
        real = mask[row]
        if not bool(real.any()):
            return None
        key = (ids[row][real].numpy().tobytes(), positions[row][real].numpy().tobytes())
        groups.setdefault(key, []).append(row)
    if all(len(rows) < 2 for rows in groups.values()):
        return None
    return list(groups.values())


def shared_layout(
    ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, prompt_cols: int, groups: list[list[int]]
) -> SharedLayout:
    """Pack `groups` (`prompt_groups`) of the [b, T] rows whose first `prompt_cols` columns are the prompt."""
    b, t = ids.shape
    own_index = torch.full((b, t), -1, dtype=torch.int64)
    tokens: list[torch.Tensor] = []
    places: list[torch.Tensor] = []
    query_lengths: list[int] = []
    keys: list[torch.Tensor] = []
    cursor = 0
    for rows in groups:
        first = rows[0]
        real = mask[first, :prompt_cols]
        prompt = torch.arange(cursor, cursor + int(real.sum()))
        tokens.append(ids[first, :prompt_cols][real])
        places.append(positions[first, :prompt_cols][real])
        query_lengths.append(prompt.numel())
        keys.append(prompt)
        cursor += prompt.numel()
        for row in rows:  # same real prompt tokens as `first`, maybe in other columns
            own_index[row, :prompt_cols][mask[row, :prompt_cols]] = prompt
            answer = mask[row, prompt_cols:]
            span = torch.arange(cursor, cursor + int(answer.sum()))
            own_index[row, prompt_cols:][answer] = span
            if span.numel():
                tokens.append(ids[row, prompt_cols:][answer])
                places.append(positions[row, prompt_cols:][answer])
                query_lengths.append(span.numel())
                keys.append(torch.cat([prompt, span]))
                cursor += span.numel()
    spans = AttentionSpans(tuple(query_lengths), torch.cat(keys), tuple(int(k.numel()) for k in keys))
    # indices grow along a row (its prompt is packed before its response), so a running max fills the gaps
    column_index = own_index.cummax(dim=1).values
    return SharedLayout(torch.cat(tokens).unsqueeze(0), torch.cat(places).unsqueeze(0), column_index, spans)


def shared_layout_of(
    ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, response_width: int
) -> SharedLayout | None:
    """The shared-prompt packing of [b, T] trimmed inputs (prompt columns, then `response_width` response
    columns); None when it would share nothing (`prompt_groups`)."""
    prompt_cols = ids.shape[1] - response_width
    # one copy to the host, not a sync per row
    host_ids = ids.cpu()
    real = (mask != 0).cpu()
    host_positions = positions.cpu()
    groups = prompt_groups(host_ids[:, :prompt_cols], real[:, :prompt_cols], host_positions[:, :prompt_cols])
    if groups is None:
        return None
    return shared_layout(host_ids, real, host_positions, prompt_cols, groups)


def lower_right_causal(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """[queries, keys] bool: query i (the (keys - queries + i)-th key's position) sees keys up to its own."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(diagonal=keys - queries)


def masked_span(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    window: int | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """One span's causal attention [1, H, n, Dv] as transformers' eager gpt-oss attention computes it: the n
    queries are the last n of the m keys' positions; keys within the last `window` positions
    (kv > q - window), a sink logit per head joined to each softmax and dropped after it."""
    n, m = q.shape[2], k.shape[2]
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    at = torch.arange(m - n, m, device=q.device)[:, None]
    key_at = torch.arange(m, device=q.device)[None, :]
    allowed = key_at <= at
    if window is not None:
        allowed = allowed & (key_at > at - window)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    if sinks is not None:
        sink = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, n, 1).to(scores.dtype)
        scores = torch.cat([scores, sink], dim=-1)
    scores = scores - scores.max(dim=-1, keepdim=True).values
    probs = F.softmax(scores, dim=-1, dtype=scores.dtype)
    if sinks is not None:
        probs = probs[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)


def span_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    spans: AttentionSpans,
    sliding_window: int | None = None,
    s_aux: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over `spans`: query [1, Hq, N, D], key [1, Hkv, N, D], value [1, Hkv, N, Dv] ->
    [1, N, Hq, Dv]. A response's keys are gathered: its prompt's, then its own. On CUDA in half precision
    all spans go to one varlen kernel call (`engines.varlen_kernel`); elsewhere each is one
    `scaled_dot_product_attention` call, and with sink logits `s_aux` or a `sliding_window` some span is
    longer than, each span as `masked_span` computes it."""
    window = (
        sliding_window if sliding_window is not None and max(spans.key_lengths) > sliding_window else None
    )
    plain = s_aux is None and window is None
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    index = spans.key_index.to(query.device)
    key, value = key.index_select(2, index), value.index_select(2, index)
    if s_aux is None:
        fast = kernel_attention(query, key, value, scaling, spans.query_lengths, spans.key_lengths, window)
        if fast is not None:
            return fast
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # GQA: key/value heads repeated, as transformers' own sdpa path does
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    parts = zip(
        torch.split(query, list(spans.query_lengths), dim=2),
        torch.split(key, list(spans.key_lengths), dim=2),
        torch.split(value, list(spans.key_lengths), dim=2),
        strict=True,
    )
    outs = []
    for q, k, v in parts:
        n, m = q.shape[2], k.shape[2]
        if not plain:
            outs.append(masked_span(q, k, v, scale, window, s_aux))
        elif n == m:
            outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling))
        else:
            sees = lower_right_causal(n, m, q.device)
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=sees, scale=scaling))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()
