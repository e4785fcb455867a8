"""No padding in the training passes: a micro-batch's rows packed into one sequence (`model.remove_padding`).

The padded path runs a micro-batch as [b, T]: prompts left-padded, responses right-padded, every pad token
through every projection and MLP. The packed path keeps only real tokens: the rows laid end to end as one
[1, N] sequence (N = the micro-batch's real tokens), position ids restarting at 0 in each row, and attention
confined to each row by a varlen attention registered with transformers (`VARLEN`): causal attention over
each row's own span (`cu_seqlens`), so no token sees another row and no mask of N x N is built.

- On CUDA in half precision all spans go to one flash-attention varlen call per layer: torch's own
  `varlen_attn`, else flash-attn's `flash_attn_varlen_func` (`engines.varlen_kernel`).
- Elsewhere each span is one causal `scaled_dot_product_attention` call (GQA's key/value heads repeated).
  That is exact, and it costs one small call per row and layer. So are values narrower than the queries
  and keys (DeepSeek-V3's MLA: 192-wide queries and keys, 128-wide values), which flash attention does not
  take.
- gpt-oss's attention has a learned sink logit per head (`s_aux`: a column of the softmax that takes
  probability and gives no value) and sliding-window layers (`sliding_window`: a token sees the last w
  tokens of its row): each span is computed as transformers' eager gpt-oss attention computes it, with
  those two, since neither sdpa nor flash-attn's varlen call takes a sink. A window that no row of the
  micro-batch reaches past is dropped (full causal attention is the same), so a Mistral-style model with a
  long window keeps the sdpa and flash-attn paths; a row longer than it gets the window, which the packed
  path ignored before.

Only the logits that predict response tokens are computed (`logits_to_keep` as an index tensor), and the
log-probs and entropy are scattered back into the [b, R'] layout the losses read. So the packed path's
outputs equal the padded path's up to float rounding (tests/engines/test_packing.py: within 1e-5 in float32,
gradients too). This is verl's `use_remove_padding`, without flash-attn being required.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from quartet.engines.inputs import ModelInputs
from quartet.engines.shared_prompts import AttentionSpans, masked_span, shared_layout_of, span_attention
from quartet.engines.varlen_kernel import kernel_attention

__all__ = [
    "VARLEN",
    "PackedInputs",
    "pack_inputs",
    "pack_sharing",
    "register_varlen_attention",
    "varlen_attention",
]

VARLEN = "quartet_varlen"
"""The attention implementation name a packed model runs with (`config._attn_implementation`)."""


@dataclass(frozen=True)
class PackedInputs:
    """One micro-batch as one sequence."""

    input_ids: torch.Tensor
    """[1, N] the rows' real tokens, row after row."""
    position_ids: torch.Tensor
    """[1, N] restarting at 0 in every row (each row's own positions)."""
    bounds: tuple[int, ...]
    """b + 1 offsets: row i spans [bounds[i], bounds[i + 1])."""
    keep: torch.Tensor
    """[K] positions in the packed sequence whose logits predict a real response token, row-major."""
    targets: torch.Tensor
    """[K] the response tokens they predict."""
    response_mask: torch.Tensor
    """[b, R'] bool: where the K outputs go back in the padded response layout (row-major, as `keep`)."""
    spans: AttentionSpans | None = None
    """Rows sharing their prompt (`pack_sharing`): the attention spans; None: each row is one span."""


def pack_inputs(inputs: ModelInputs) -> PackedInputs:
    """Pack a micro-batch's trimmed inputs (`build_inputs`): real tokens only, rows end to end."""
    ids, mask = inputs.input_ids, inputs.attention_mask != 0
    b, t = ids.shape
    width = inputs.response_width
    flat_mask = mask.reshape(-1)
    packed_index = torch.cumsum(flat_mask.to(torch.int64), 0) - 1  # padded (row, col) -> packed position
    lengths = mask.sum(dim=1)
    bounds = (0, *torch.cumsum(lengths, 0).tolist())
    # response token j of a row sits at column t - width + j; its logits come from the column before
    resp = inputs.response_mask
    # on the inputs' device: a micro-batch already on the GPU indexes with GPU masks
    cols = torch.arange(t - width - 1, t - 1, device=ids.device).expand(b, width)
    rows = torch.arange(b, device=ids.device).unsqueeze(1).expand(b, width)
    keep = packed_index[(rows * t + cols)[resp]]
    targets = ids[:, t - width :][resp]
    return PackedInputs(
        input_ids=ids[mask].unsqueeze(0),
        position_ids=inputs.position_ids[mask].unsqueeze(0),
        bounds=tuple(int(x) for x in bounds),
        keep=keep,
        targets=targets,
        response_mask=resp,
    )


def pack_sharing(inputs: ModelInputs) -> PackedInputs | None:
    """Pack a micro-batch with each prompt once for the rows that share it (`engines.shared_prompts`); None
    when no two rows share a prompt (then `pack_inputs`)."""
    ids, width = inputs.input_ids, inputs.response_width
    layout = shared_layout_of(ids, inputs.attention_mask, inputs.position_ids, width)
    if layout is None:
        return None
    b, t = ids.shape
    resp = inputs.response_mask
    # response token j of a row is chosen by the logits at its column before: a prompt token for j = 0
    cols = torch.arange(t - width - 1, t - 1).expand(b, width)
    keep = layout.column_index.gather(1, cols)[resp.cpu()]
    ends = torch.cumsum(torch.tensor((0, *layout.spans.query_lengths)), 0).tolist()
    return PackedInputs(
        input_ids=layout.input_ids.to(ids.device),
        position_ids=layout.position_ids.to(ids.device),
        bounds=tuple(int(x) for x in ends),
        keep=keep.to(ids.device),
        targets=ids[:, t - width :][resp],
        response_mask=resp,
        spans=layout.spans,
    )


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    quartet_bounds: tuple[int, ...] | None = None,
    sliding_window: int | None = None,
    s_aux: torch.Tensor | None = None,
    quartet_spans: AttentionSpans | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: causal attention within each span of `quartet_bounds`, optionally
    within a `sliding_window` and with sink logits `s_aux` [Hq] (gpt-oss).

    query [1, Hq, N, D], key [1, Hkv, N, D], value [1, Hkv, N, Dv] -> ([1, N, Hq, Dv], None).
    With `quartet_spans` (rows sharing their prompt, `engines.shared_prompts`) attention runs over those
    spans instead of the rows.
    """
    if quartet_bounds is None:
        raise ValueError(
            f"attention '{VARLEN}' needs the packed rows' bounds (quartet_bounds); the engine passes them"
        )
    if dropout:
        raise ValueError("packed attention runs without attention dropout (training passes use none)")
    if quartet_spans is not None:
        return span_attention(query, key, value, scaling, quartet_spans, sliding_window, s_aux), None
    lengths = [z - a for a, z in zip(quartet_bounds[:-1], quartet_bounds[1:], strict=True)]
    # a window no row reaches past is full causal attention (Mistral's 4k window, most rows)
    window = sliding_window if sliding_window is not None and max(lengths) > sliding_window else None
    if s_aux is None:
        fast = kernel_attention(query, key, value, scaling, tuple(lengths), tuple(lengths), window)
        if fast is not None:
            return fast, None
    plain = s_aux is None and window is None
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # GQA: key/value heads repeated, as transformers' own sdpa path does
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    # split, not slicing: the backward of a split is one concatenation, that of b slices b full-size buffers
    spans = zip(
        torch.split(query, lengths, dim=2),
        torch.split(key, lengths, dim=2),
        torch.split(value, lengths, dim=2),
        strict=True,
    )
    if plain:
        outs = [
            F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
            for q, k, v in spans
            if q.shape[2]
        ]
    else:
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        outs = [masked_span(q, k, v, scale, window, s_aux) for q, k, v in spans if q.shape[2]]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The packed attention confines itself to each row: no mask tensor is built."""
    return None


def register_varlen_attention() -> None:
    """Make `VARLEN` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    AttentionMaskInterface.register(VARLEN, _no_mask)
