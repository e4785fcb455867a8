"""The fused sampler's Triton code (imported by `sampler` on first use: importing it needs Triton).

One program per row. SPAN (a constexpr) is the vocabulary rounded up to whole BLOCKs, the bound of every
pass (a constant bound also lets Triton 3.3's interpreter run the loops). The helpers are the passes over
the row that `sampler`'s docstring describes. Each 56-bit rank key is (the scaled logit's
order-preserving integer + 2**31) << 24 | (2**24 - 1 - index), so a larger key ranks earlier, and equal
logits rank by index. A threshold search builds the largest key K with a monotone property bit by bit,
from the top bit down: one pass over the row per bit.
"""

# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["sampler_kernel"]


@triton.jit
def _keys(base, start, vocab, temp, BLOCK: tl.constexpr, SPAN: tl.constexpr, INDEX_BITS: tl.constexpr):
    """Scaled logits, their rank keys and the in-range mask of entries start..start+BLOCK."""
    idx = start + tl.arange(0, BLOCK)
    mask = idx < vocab
    x = tl.load(base + idx, mask=mask, other=0.0).to(tl.float32) / temp
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties +0.0, as in a sort
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2147483648
    low = (1 << INDEX_BITS) - 1 - idx.to(tl.int64)
    return x, (ordered << INDEX_BITS) | low, mask


@triton.jit
def _row_stats(base, vocab, temp, BLOCK: tl.constexpr, SPAN: tl.constexpr):
    """The first index of the raw maximum (greedy's token), the scaled maximum, and sum(exp(scaled - max))."""
    best = -float("inf")
    best_idx = vocab * 0
    scaled_max = -float("inf")
    for start in range(0, SPAN, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < vocab
        raw = tl.load(base + idx, mask=mask, other=-float("inf")).to(tl.float32)
        chunk_max = tl.max(raw, axis=0)
        chunk_idx = tl.min(tl.where((raw == chunk_max) & mask, idx, vocab), axis=0)
        take = chunk_max > best
        best_idx = tl.where(take, chunk_idx, best_idx)
        best = tl.where(take, chunk_max, best)
        scaled_max = tl.maximum(scaled_max, tl.max(tl.where(mask, raw / temp, -float("inf")), axis=0))
    total = 0.0
    for start in range(0, SPAN, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < vocab
        x = tl.load(base + idx, mask=mask, other=0.0).to(tl.float32) / temp
        total += tl.sum(tl.where(mask, tl.exp(x - scaled_max), 0.0), axis=0)
    return best_idx, scaled_max, total


@triton.jit
def _mass_from(
    base,
    vocab,
    temp,
    scaled_max,
    lower,
    cut,
    BLOCK: tl.constexpr,
    SPAN: tl.constexpr,
    INDEX_BITS: tl.constexpr,
):
    """sum(exp(scaled - max)) over the entries whose key is >= both `lower` and `cut`."""
    mass = 0.0
    for start in range(0, SPAN, BLOCK):
        x, key, mask = _keys(base, start, vocab, temp, BLOCK, SPAN, INDEX_BITS)
        inside = mask & (key >= lower) & (key >= cut)
        mass += tl.sum(tl.where(inside, tl.exp(x - scaled_max), 0.0), axis=0)
    return mass


@triton.jit
def _top_k_cut(base, vocab, temp, k, top_step, BLOCK: tl.constexpr, SPAN: tl.constexpr,
               INDEX_BITS: tl.constexpr, KEY_BITS: tl.constexpr):  # fmt: skip
    """The largest key K with count(key >= K) >= k: the k-th ranked key (0, all kept, when k >= vocab)."""
    cut = top_step * 0
    if k < vocab:
        step = top_step
        for _ in range(KEY_BITS):
            cand = cut + step
            count = 0
            for start in range(0, SPAN, BLOCK):
                x, key, mask = _keys(base, start, vocab, temp, BLOCK, SPAN, INDEX_BITS)
                count += tl.sum(tl.where(mask & (key >= cand), 1, 0), axis=0)
            cut = tl.where(count >= k, cand, cut)
            step = step // 2
    return cut


@triton.jit
def _top_p_cut(base, vocab, temp, scaled_max, cut, p, top_step, BLOCK: tl.constexpr, SPAN: tl.constexpr,
               INDEX_BITS: tl.constexpr, KEY_BITS: tl.constexpr):  # fmt: skip
    """Top-p on the top-k-renormalised mass: a token stays while the mass ranked before it is below p.

    The kept set is key >= the largest K with mass(kept, key >= K) >= p * mass(kept) (`cut` when p >= 1).
    """
    if p < 1.0:
        kept = _mass_from(base, vocab, temp, scaled_max, cut, cut, BLOCK, SPAN, INDEX_BITS)
        p_cut = top_step * 0
        step = top_step
        for _ in range(KEY_BITS):
            cand = p_cut + step
            mass = _mass_from(base, vocab, temp, scaled_max, cand, cut, BLOCK, SPAN, INDEX_BITS)
            p_cut = tl.where(mass >= p * kept, cand, p_cut)
            step = step // 2
        cut = tl.maximum(cut, p_cut)
    return cut


@triton.jit
def _ranked_draw(base, vocab, temp, scaled_max, cut, u, top_step, BLOCK: tl.constexpr, SPAN: tl.constexpr,
                 INDEX_BITS: tl.constexpr, KEY_BITS: tl.constexpr):  # fmt: skip
    """The first ranked token (key >= cut) whose cumulative mass exceeds u * (their mass): the largest K with
    mass(key >= K) > target. None exceeds it (rounding): the last rank, as `sample_next`'s clamp."""
    target = u * _mass_from(base, vocab, temp, scaled_max, cut, cut, BLOCK, SPAN, INDEX_BITS)
    lowest = top_step * 4  # above every key
    for start in range(0, SPAN, BLOCK):
        x, key, mask = _keys(base, start, vocab, temp, BLOCK, SPAN, INDEX_BITS)
        lowest = tl.minimum(lowest, tl.min(tl.where(mask, key, top_step * 4), axis=0))
    pick = top_step * 0
    step = top_step
    for _ in range(KEY_BITS):
        cand = pick + step
        mass = _mass_from(base, vocab, temp, scaled_max, cand, cut, BLOCK, SPAN, INDEX_BITS)
        pick = tl.where(mass > target, cand, pick)
        step = step // 2
    pick = tl.where(pick == 0, lowest, pick)
    low_mask = (1 << INDEX_BITS) - 1
    return (low_mask - (pick & low_mask)).to(tl.int32)


@triton.jit
def _vocab_draw(base, vocab, temp, scaled_max, target, BLOCK: tl.constexpr, SPAN: tl.constexpr):
    """The first index whose cumulative mass (vocabulary order) exceeds `target`; vocab - 1 if none does."""
    running = 0.0
    found = vocab - 1
    for start in range(0, SPAN, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < vocab
        x = tl.load(base + idx, mask=mask, other=0.0).to(tl.float32) / temp
        e = tl.where(mask, tl.exp(x - scaled_max), 0.0)
        cdf = running + tl.cumsum(e, axis=0)
        found = tl.minimum(found, tl.min(tl.where(mask & (cdf > target), idx, vocab), axis=0))
        running += tl.sum(e, axis=0)
    return found


@triton.jit
def sampler_kernel(
    logits_ptr, row_stride, temp_ptr, topk_ptr, topp_ptr, u_ptr, tok_ptr, lp_ptr, vocab, top_step,
    RANKED: tl.constexpr, BLOCK: tl.constexpr, SPAN: tl.constexpr, INDEX_BITS: tl.constexpr,
    KEY_BITS: tl.constexpr,
):  # fmt: skip
    """One row's token and log-prob: greedy (temperature <= 0), the ranked draw for a row with top-k or
    top-p in a batch compiled for them (RANKED), else the vocabulary-order draw."""
    row = tl.program_id(0)
    base = logits_ptr + row * row_stride
    t_raw = tl.load(temp_ptr + row)
    temp = tl.where(t_raw <= 0.0, 1.0, t_raw)
    token, scaled_max, total = _row_stats(base, vocab, temp, BLOCK, SPAN)
    u = tl.load(u_ptr + row)
    if t_raw > 0.0:
        k = tl.load(topk_ptr + row)
        p = tl.load(topp_ptr + row)
        if RANKED and ((k > 0) | (p < 1.0)):  # this row filters: its own order is the ranked one
            k = tl.where((k <= 0) | (k > vocab), vocab, k)
            cut = _top_k_cut(base, vocab, temp, k, top_step, BLOCK, SPAN, INDEX_BITS, KEY_BITS)
            cut = _top_p_cut(
                base, vocab, temp, scaled_max, cut, p, top_step, BLOCK, SPAN, INDEX_BITS, KEY_BITS
            )
            token = _ranked_draw(
                base, vocab, temp, scaled_max, cut, u, top_step, BLOCK, SPAN, INDEX_BITS, KEY_BITS
            )
        else:
            token = _vocab_draw(base, vocab, temp, scaled_max, u * total, BLOCK, SPAN)
    tl.store(tok_ptr + row, token.to(tl.int64))
    chosen = tl.load(base + token).to(tl.float32) / temp
    tl.store(lp_ptr + row, chosen - scaled_max - tl.log(total))
