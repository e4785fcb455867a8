"""Cutting one rank's rows into micro-batches: fixed size, or packed by a token budget.

A plan is a list of index tensors, one per micro-batch, that together hold every row exactly once. In
token-budget mode rows are packed first-fit decreasing (longest row first, each into the first micro-batch
where it still fits), a classic bin-packing heuristic that uses at most 11/9 OPT + 1 micro-batches; since
the rows of a micro-batch then have similar lengths, little compute is lost to padding. The budget counts
valid tokens (prompt + response), like verl's dynamic batch size.

With several data-parallel ranks every rank must run the same number of forwards (each FSDP forward and
backward is a collective), so plans are lengthened to the largest count over ranks by `extend_plan`:
the micro-batch with the most rows is split in two while one with two or more rows exists, then empty
micro-batches are added (the engine runs those on a stand-in row and discards the result).
"""

from __future__ import annotations

import torch

from quartet.engines.spec import MicroSpec

__all__ = ["extend_plan", "plan_micro_batches", "restore_order"]


def plan_micro_batches(lengths: torch.Tensor, micro: MicroSpec) -> list[torch.Tensor]:
    """Row indices of each micro-batch.

    Args:
        lengths: [B] valid tokens of each row (prompt + response).
        micro: fixed size or token budget.

    Returns:
        Index tensors (int64) whose concatenation is a permutation of range(B); in fixed mode, in order.
    """
    n = int(lengths.shape[0])
    if micro.max_tokens is None:
        return list(torch.split(torch.arange(n), micro.size))
    budget = micro.max_tokens
    # Stable sort: equal lengths keep their order, so the plan is deterministic.
    order = torch.sort(lengths.to(torch.int64), descending=True, stable=True).indices.tolist()
    bins: list[list[int]] = []
    loads: list[int] = []
    for row in order:
        need = int(lengths[row])
        for b, load in enumerate(loads):
            if load + need <= budget:
                bins[b].append(row)
                loads[b] += need
                break
        else:
            bins.append([row])
            loads.append(need)
    return [torch.tensor(b, dtype=torch.int64) for b in bins]


def extend_plan(plan: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """`plan` lengthened to `count` micro-batches: split the largest ones, then append empty ones.

    Splitting a micro-batch never makes either half exceed the budget it already kept.
    """
    if count < len(plan):
        raise ValueError(f"cannot shrink a plan of {len(plan)} micro-batches to {count}")
    out = [p for p in plan if p.numel()]
    while len(out) < count:
        big = max(range(len(out)), key=lambda i: out[i].numel(), default=None)
        if big is None or out[big].numel() < 2:
            out.append(torch.zeros(0, dtype=torch.int64))
            continue
        rows = out.pop(big)
        half = (rows.numel() + 1) // 2
        out[big:big] = [rows[:half], rows[half:]]
    return out


def restore_order(parts: list[torch.Tensor], plan: list[torch.Tensor]) -> torch.Tensor:
    """Outputs of the micro-batches of `plan` put back in row order: [B, ...] from parts [b_i, ...]."""
    index = torch.cat(plan)
    if not parts:
        raise ValueError("no micro-batch outputs to join")
    joined = torch.cat(parts)
    out = torch.empty_like(joined)
    out[index.to(joined.device)] = joined
    return out
