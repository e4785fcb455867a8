"""Log-probs and entropy of response tokens from the last hidden states, never building the [N, V] logits.

The plain head computes the logits [N, V] of the N response positions, upcasts them to float32 and takes a
log-softmax; with a real vocabulary (Qwen2: 151,936 entries) and 10k tokens the half-precision logits alone
are 3 GB, their float32 copies 6 GB, and autograd keeps them for the backward. Here the logits exist one
block at a time: tokens in chunks of `token_chunk`, the vocabulary in blocks of `vocab_block`, and for each
block the logits z = (h W_b^T + b_b) / temperature are computed (matmul in the compute dtype, bf16 under
autocast, then upcast to float32) and folded into running sums with an online softmax:

    m = max z,  s = sum exp(z - m),  u = sum exp(z - m) z      (rescaled whenever m grows)
    logsumexp = m + log s,  log p[target] = z[target] - logsumexp,  H = logsumexp - u / s

the stable form of `quartet.core.entropy` (nothing exponentiated above 0; z = -inf adds exactly 0).

Backward recomputes each block's logits from the saved hidden states and weight (no [N, V] tensor is saved)
and accumulates grad_hidden and grad_weight block by block, with p = exp(z - logsumexp):

    d log p[target] / dz = onehot(target) - p,      dH / dz = -p (z - E_p[z])

each divided by the temperature for the raw logits. The entropy's part is skipped when its output received
no gradient (a metric), and its forward sums are skipped when it is not asked for.

The engine runs this inside the model's own forward by standing in for the lm_head's forward
(`fused_lm_head`): the decoder, FSDP2's unsharding of the root parameters and PEFT's adapters all run as
usual, and the "logits" the model returns are [..., 2]: log-prob and entropy per kept position.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quartet.engines.hf_modules import hf_model
from quartet.engines.support_head import support_from_hidden, topk_from_hidden

log = logging.getLogger(__name__)

__all__ = [
    "TOKEN_CHUNK",
    "VOCAB_BLOCK",
    "HeadRequest",
    "find_lm_head",
    "fused_lm_head",
    "fused_logprobs_entropy",
    "unsupported_reason",
]

TOKEN_CHUNK = 4096
"""Tokens per chunk: with `VOCAB_BLOCK` the float32 temporaries are 4096 x 8192 x 4 B = 128 MB each."""

VOCAB_BLOCK = 8192
"""Vocabulary entries per block (19 blocks for Qwen2's 151,936)."""

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
"""Config attributes of models that transform the lm_head's output before returning it (Gemma2, Cohere,
Granite, ...): the fused head cannot stand in for them."""


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The matmul dtype the plain lm_head would use: autocast's when it is on, else the promoted dtype."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


@dataclass(frozen=True)
class _Blocks:
    """What every block computation needs besides the hidden states."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    temperature: float
    dtype: torch.dtype
    vocab_block: int

    def ranges(self) -> Iterator[tuple[int, int]]:
        vocab = self.weight.shape[0]
        for start in range(0, vocab, self.vocab_block):
            yield start, min(start + self.vocab_block, vocab)

    def logits(self, h: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """[n, stop - start] float32 logits / temperature of one block (matmul in the compute dtype)."""
        w = self.weight[start:stop].to(self.dtype)
        b = None if self.bias is None else self.bias[start:stop].to(self.dtype)
        return F.linear(h, w, b).float() / self.temperature


def _target_logits(z: torch.Tensor, targets: torch.Tensor, start: int, stop: int) -> tuple[torch.Tensor, ...]:
    """(rows whose target lies in [start, stop), their column in the block, the block's logit there)."""
    inside = (targets >= start) & (targets < stop)
    column = (targets - start).clamp(0, stop - start - 1)
    return inside, column, z.gather(1, column.unsqueeze(1)).squeeze(1)


def _chunk_forward(
    h: torch.Tensor, targets: torch.Tensor, blocks: _Blocks, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logsumexp, target logit, E_p[z]) of one chunk of tokens, all [n] float32, by an online softmax.

    Rows whose logits are all -inf get logsumexp -inf (as `torch.logsumexp`) and E_p[z] 0."""
    n = h.shape[0]
    m = torch.full((n,), -torch.inf, dtype=torch.float32, device=h.device)
    s = torch.zeros_like(m)
    u = torch.zeros_like(m)
    z_target = torch.full_like(m, -torch.inf)
    for start, stop in blocks.ranges():
        z = blocks.logits(h, start, stop)
        m_new = torch.maximum(m, z.amax(dim=-1))
        shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # all -inf so far: 0
        rescale = torch.exp(m - shift)  # previous sums were relative to m (0 while they are 0)
        e = torch.exp(z - shift.unsqueeze(1))
        s = s * rescale + e.sum(dim=-1)
        if with_entropy:  # z = -inf has e = 0: zero z there so 0 * inf never appears
            u = u * rescale + (e * torch.where(e > 0, z, torch.zeros((), device=z.device))).sum(dim=-1)
        m = m_new
        inside, _, picked = _target_logits(z, targets, start, stop)
        z_target = torch.where(inside, picked, z_target)
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    some = s > 0
    lse = torch.where(some, shift + torch.log(s.clamp(min=torch.finfo(torch.float32).tiny)), -torch.inf)
    mean_z = torch.where(some, u / s.clamp(min=torch.finfo(torch.float32).tiny), torch.zeros_like(u))
    return lse, z_target, mean_z


def _chunk_backward(
    h: torch.Tensor,
    targets: torch.Tensor,
    saved: tuple[torch.Tensor, torch.Tensor],
    grads: tuple[torch.Tensor | None, torch.Tensor | None],
    blocks: _Blocks,
    grad_weight: torch.Tensor | None,
    grad_bias: torch.Tensor | None,
) -> torch.Tensor:
    """grad of one chunk's hidden states [n, H] (float32); adds the chunk's share to grad_weight/bias."""
    lse, mean_z = saved
    g_lp, g_ent = grads
    lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # all -inf rows: p = 0 everywhere
    grad_h = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
    for start, stop in blocks.ranges():
        z = blocks.logits(h, start, stop)
        p = torch.exp(z - lse.unsqueeze(1))
        # g = g_lp (onehot - p) - g_ent p (z - E_p[z]) = -p (g_lp + g_ent (z - E_p[z])) + g_lp onehot
        if g_ent is not None:  # z = -inf has p = 0: zero z there so 0 * inf never appears
            z_safe = torch.where(p > 0, z, torch.zeros((), device=z.device))
            coef = (z_safe - mean_z.unsqueeze(1)) * g_ent.unsqueeze(1)
            if g_lp is not None:
                coef += g_lp.unsqueeze(1)
        else:
            coef = torch.zeros_like(z) if g_lp is None else g_lp.unsqueeze(1)
        g = p * coef
        g.neg_()
        if g_lp is not None:
            inside, column, _ = _target_logits(z, targets, start, stop)
            g.scatter_add_(1, column.unsqueeze(1), torch.where(inside, g_lp, 0.0).unsqueeze(1))
        g /= blocks.temperature  # z = raw / temperature
        g_low = g.to(blocks.dtype)
        grad_h += (g_low @ blocks.weight[start:stop].to(blocks.dtype)).float()
        if grad_weight is not None:
            grad_weight[start:stop] += (g_low.T @ h).float()
        if grad_bias is not None:
            grad_bias[start:stop] += g.sum(dim=0)
    return grad_h


class _FusedHead(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], bias [V] | None, targets [N]) -> (log-probs [N], entropy [N])."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        blocks: _Blocks,
        token_chunk: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)  # an unused output's grad stays None: its backward work is skipped
        h = hidden.to(blocks.dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            parts = [
                _chunk_forward(hc, tc, blocks, with_entropy)
                for hc, tc in zip(torch.split(h, token_chunk), torch.split(targets, token_chunk), strict=True)
            ]
        lse, z_target, mean_z = (torch.cat(c) for c in zip(*parts, strict=True)) if parts else _empty(h)
        logprobs = z_target - lse
        entropy = torch.where(torch.isfinite(lse), lse - mean_z, torch.zeros_like(lse))
        if not with_entropy:  # no sums were taken; a placeholder that carries no graph
            entropy = torch.zeros_like(lse)
            ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, mean_z)
        ctx.blocks = blocks
        ctx.token_chunk = token_chunk
        return logprobs, entropy

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse, mean_z = ctx.saved_tensors
        blocks: _Blocks = ctx.blocks
        blocks = _Blocks(weight, bias, blocks.temperature, blocks.dtype, blocks.vocab_block)
        want_w, want_b = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None
        h, chunk = hidden.to(blocks.dtype), ctx.token_chunk
        pieces = []
        with torch.autocast(hidden.device.type, enabled=False):
            for i in range(0, h.shape[0], chunk):
                rows = slice(i, i + chunk)
                g_lp, g_ent = (None if x is None else x[rows].float() for x in grads)
                pieces.append(
                    _chunk_backward(
                        h[rows],
                        targets[rows],
                        (lse[rows], mean_z[rows]),
                        (g_lp, g_ent),
                        blocks,
                        grad_w,
                        grad_b,
                    )
                )
        grad_h = torch.cat(pieces).to(hidden.dtype) if pieces else torch.zeros_like(hidden)
        return (
            grad_h if ctx.needs_input_grad[0] else None,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
        )


def _empty(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    zero = torch.zeros(0, dtype=torch.float32, device=h.device)
    return zero, zero, zero


def fused_logprobs_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    *,
    with_entropy: bool = False,
    token_chunk: int = TOKEN_CHUNK,
    vocab_block: int = VOCAB_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` and (if asked) entropy under softmax((hidden W^T + bias) / temperature).

    Args:
        hidden: [..., H] last hidden states at the positions that predict `targets`.
        weight: [V, H] the lm_head weight; bias: [V] or None.
        targets: [...] token ids.
        temperature: > 0.
        with_entropy: also compute the entropy (else its sums are skipped and None is returned).

    Returns:
        ([...] float32 log-probs, [...] float32 entropy or None), differentiable with respect to hidden,
        weight and bias. Matmuls run in autocast's dtype when autocast is on (as the plain lm_head would).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if token_chunk < 1 or vocab_block < 1:
        raise ValueError(f"token_chunk and vocab_block must be >= 1, got {token_chunk} and {vocab_block}")
    if hidden.shape[:-1] != targets.shape or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"shapes do not fit: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}, "
            f"targets {tuple(targets.shape)} (want hidden [..., H], weight [V, H], targets [...])"
        )
    lead = targets.shape
    blocks = _Blocks(weight, bias, float(temperature), _compute_dtype(hidden, weight), vocab_block)
    flat_h, flat_t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1).long()
    logprobs, entropy = _FusedHead.apply(  # type: ignore[no-untyped-call]
        flat_h, weight, bias, flat_t, blocks, token_chunk, with_entropy
    )
    return logprobs.reshape(lead), entropy.reshape(lead) if with_entropy else None


@dataclass(frozen=True)
class HeadRequest:
    """What the fused lm_head computes at the positions the model keeps (`logits_to_keep`)."""

    targets: torch.Tensor
    """[b, K] the tokens the kept positions predict."""
    temperature: float
    with_entropy: bool
    entropy_grad: bool = True
    """False: the entropy is returned without a graph (a metric)."""
    top_k: int = 0
    """> 0: also the k most likely tokens per position (`support_head`): `side["topk_logprobs"]`,
    `side["topk_ids"]`."""
    support: torch.Tensor | None = None
    """[b, K, k] token ids: also the log-probs there, with graph: `side["support_logprobs"]`."""
    side: dict[str, torch.Tensor] = field(default_factory=dict)
    """The extra outputs the call computed, by `ModelOutputs` field name (a head returns only [b, K, 2]
    through the model)."""

    def __call__(self, hidden: torch.Tensor, lm_head: nn.Linear) -> torch.Tensor:
        """[b, K, H] kept hidden states -> [b, K, 2] float32: log-prob and entropy (0 when not asked)."""
        targets = self.targets.to(hidden.device)
        logprobs, entropy = fused_logprobs_entropy(
            hidden, lm_head.weight, lm_head.bias, targets, self.temperature, with_entropy=self.with_entropy
        )
        self._extras(hidden, lm_head, logprobs)
        if entropy is None:
            entropy = torch.zeros_like(logprobs)
        elif not self.entropy_grad:
            entropy = entropy.detach()
        return torch.stack([logprobs, entropy], dim=-1)

    def _extras(self, hidden: torch.Tensor, lm_head: nn.Linear, logprobs: torch.Tensor) -> None:
        """The top-k and support outputs asked for, into `side` ([b, K, k] each)."""
        if not self.top_k and self.support is None:
            return
        lead, dtype = logprobs.shape, _compute_dtype(hidden, lm_head.weight)
        flat_h = hidden.reshape(-1, hidden.shape[-1])
        with torch.autocast(hidden.device.type, enabled=False):
            if self.top_k:
                values, ids = topk_from_hidden(
                    flat_h, lm_head.weight, lm_head.bias, self.top_k, self.temperature, dtype
                )
                self.side["topk_logprobs"] = values.reshape(*lead, -1)
                self.side["topk_ids"] = ids.reshape(*lead, -1)
            if self.support is not None:
                ids = self.support.to(hidden.device).reshape(flat_h.shape[0], -1)
                flat_t = self.targets.to(hidden.device).reshape(-1)
                self.side["support_logprobs"] = support_from_hidden(
                    flat_h, lm_head.weight, lm_head.bias, flat_t, logprobs.reshape(-1), ids,
                    self.temperature, dtype,
                ).reshape(*lead, -1)  # fmt: skip


@contextmanager
def fused_lm_head(lm_head: nn.Linear, request: HeadRequest) -> Iterator[None]:
    """Inside the block `lm_head(hidden)` returns `request(hidden, lm_head)` instead of logits.

    Running inside the model's forward keeps every wrapper's hooks in force (FSDP2 unshards the root's
    parameters, the lm_head weight among them, around that forward; its gradient reaches the sharded
    parameter as the plain logits' would)."""
    own = lm_head.__dict__.get("forward")
    lm_head.forward = lambda hidden: request(hidden, lm_head)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        if own is None:
            del lm_head.forward
        else:
            lm_head.forward = own  # type: ignore[method-assign]


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the fused head cannot stand in for `model`'s lm_head (None when it can).

    `model` is the transformers causal LM (unwrapped from PEFT): its output embeddings must be a plain
    `nn.Linear` (a LoRA-adapted or otherwise wrapped lm_head is not), and its config must not transform the
    logits after the lm_head (soft-capping, scaling)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, nn.Linear) or not hasattr(head, "weight"):
        return f"its output embeddings are a {type(head).__name__}, not a plain nn.Linear"
    config = getattr(model, "config", None)
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value is not None and value != 1:
            return f"its config transforms the logits after the lm_head ({name}={value})"
    return None


def find_lm_head(module: nn.Module) -> nn.Linear | None:
    """The lm_head of the causal LM in `module` (plain, PEFT-wrapped or FSDP2-sharded) that the fused head
    can stand in for, or None with a warning saying why not (the engine then uses the plain logits)."""
    model = hf_model(module)
    reason = unsupported_reason(model)
    if reason is not None:
        log.warning("fused_head is off for %s: %s; the plain logits head runs", type(model).__name__, reason)
        return None
    head = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    assert isinstance(head, nn.Linear)
    return head
