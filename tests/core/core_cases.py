"""Hypothesis strategies for the RL math tests: random batches with random masks and prompt groups.

Masks mix the shapes a trainer sees: full rows, right-padded rows, all-masked rows, multi-turn rows (model
tokens, a span of tool tokens, model tokens again, padding) and arbitrary patterns. Groups are given in
arbitrary order and in each of the accepted index forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

MASK_KINDS = ("full", "empty", "prefix", "multi_turn", "random")


@st.composite
def mask_row(draw: st.DrawFn, length: int) -> list[bool]:
    kind = draw(st.sampled_from(MASK_KINDS))
    if kind == "full":
        return [True] * length
    if kind == "empty":
        return [False] * length
    if kind == "prefix":
        n = draw(st.integers(0, length))
        return [True] * n + [False] * (length - n)
    if kind == "multi_turn":
        first = draw(st.integers(0, length))
        tool = draw(st.integers(0, length - first))
        second = draw(st.integers(0, length - first - tool))
        row = [True] * first + [False] * tool + [True] * second
        return row + [False] * (length - len(row))
    return draw(st.lists(st.booleans(), min_size=length, max_size=length))


@st.composite
def masks(draw: st.DrawFn, batch: int, length: int) -> torch.Tensor:
    return torch.tensor([draw(mask_row(length)) for _ in range(batch)], dtype=torch.bool).reshape(
        batch, length
    )


def index_form(keys: list[int], form: str) -> Any:
    """The same grouping as a list of strings, a list of ints, a numpy object array or a tensor."""
    if form == "str":
        return [f"prompt-{k}" for k in keys]
    if form == "numpy":
        arr = np.empty(len(keys), dtype=object)
        arr[:] = [f"uid{k}" for k in keys]
        return arr
    if form == "tensor":
        return torch.tensor(keys, dtype=torch.long)
    return list(keys)


def plain_keys(index: Any) -> list[Any]:
    return index.tolist() if isinstance(index, torch.Tensor | np.ndarray) else list(index)


@dataclass
class Case:
    """One random batch, float64. `mask` is bool; `mask_f` the same as 0/1 floats."""

    mask: torch.Tensor
    rewards: torch.Tensor
    values: torch.Tensor
    baselines: torch.Tensor
    index: Any
    logp: torch.Tensor
    old: torch.Tensor
    rollout: torch.Tensor
    ref: torch.Tensor
    adv: torch.Tensor
    float_mask: bool

    @property
    def mask_arg(self) -> torch.Tensor:
        """The mask as the library receives it in this case: bool or float 0/1."""
        return self.mask.double() if self.float_mask else self.mask


@st.composite
def cases(draw: st.DrawFn, max_batch: int = 6, max_len: int = 10) -> Case:
    batch = draw(st.integers(1, max_batch))
    length = draw(st.integers(1, max_len))
    mask = draw(masks(batch, length))
    n_groups = draw(st.integers(1, batch))
    keys = draw(st.lists(st.integers(0, n_groups - 1), min_size=batch, max_size=batch))
    form = draw(st.sampled_from(["str", "int", "numpy", "tensor"]))
    reward_kind = draw(st.sampled_from(["dense", "binary_outcome", "equal"]))
    spread = draw(st.sampled_from([0.01, 0.2, 1.0]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    if reward_kind == "dense":
        rewards = randn(batch, length)
    else:
        bits = (
            torch.randint(0, 2, (batch,), generator=g).double() if reward_kind == "binary_outcome" else None
        )
        rewards = randn(batch, length) * 0.0
        for i in range(batch):
            valid = mask[i].nonzero().flatten()
            if valid.numel():
                rewards[i, valid[-1]] = bits[i] if bits is not None else 0.5
        rewards = torch.where(mask, rewards, randn(batch, length))  # garbage where masked: must be ignored
    logp = -randn(batch, length).abs()
    return Case(
        mask=mask,
        rewards=rewards,
        values=randn(batch, length),
        baselines=randn(batch),
        index=index_form(keys, form),
        logp=logp,
        old=logp + spread * randn(batch, length),
        rollout=logp + spread * randn(batch, length),
        ref=logp + spread * randn(batch, length),
        adv=randn(batch, length),
        float_mask=draw(st.booleans()),
    )


def multi_turn_case(float_mask: bool = False, seed: int = 0) -> Case:
    """A fixed batch with every mask shape at once, for tests that must not rely on what hypothesis draws.

    Rows: full; all masked; two model turns around a tool span; three turns with two tool spans and
    padding; right padding; a single valid token in the middle. Groups are interleaved (g0 rows 0, 3, 5;
    g1 rows 1, 4; g2 row 2 alone, a singleton).
    """
    mask = torch.tensor(
        [
            [1, 1, 1, 1, 1, 1, 1, 1],
            [0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 1, 1, 1],
            [1, 0, 0, 1, 1, 0, 1, 0],
            [1, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 1, 0, 0, 0, 0],
        ],
        dtype=torch.bool,
    )
    g = torch.Generator().manual_seed(seed)
    shape = tuple(mask.shape)

    def randn(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g, dtype=torch.float64)

    logp = -randn(*shape).abs()
    return Case(
        mask=mask,
        rewards=randn(*shape),
        values=randn(*shape),
        baselines=randn(shape[0]),
        index=["g0", "g1", "g2", "g0", "g1", "g0"],
        logp=logp,
        old=logp + 0.5 * randn(*shape),
        rollout=logp + 0.5 * randn(*shape),
        ref=logp + 0.5 * randn(*shape),
        adv=randn(*shape),
        float_mask=float_mask,
    )
