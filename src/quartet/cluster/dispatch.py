"""How a role method's input is split over ranks and its outputs joined, declared next to the method.

    class Critic:
        @dispatch(Split.BY_DP_RANK)
        def compute_values(self, batch: Batch) -> Batch: ...

        @dispatch(Split.BROADCAST)
        def save(self, path: str) -> None: ...

- BY_DP_RANK: every `Batch` argument is padded to a multiple of the data-parallel size (copies of its first
  rows) and cut into equal consecutive chunks; chunk d goes to every rank of data-parallel rank d; other
  arguments are broadcast. The collecting rank of each chunk returns it; outputs are concatenated in
  data-parallel order (Batch) and the padding rows removed; non-Batch outputs are returned as a list.
- BROADCAST: the same arguments to every rank; the list of collecting ranks' outputs is returned.
- RANK_ZERO: only rank 0 runs the method; its output is returned.
Whether the driver waits is the call's choice, not the declaration's (`RoleGroup.submit_batch`).

By default every rank is its own data-parallel rank and collects. A role whose ranks form model-parallel
groups (e.g. tensor-parallel peers that must see the same chunk) defines `data_rank(self) -> DataRank`;
the peers that are not collecting ranks still run every call, and their outputs are dropped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ParamSpec, TypeVar

from quartet.cluster.errors import DispatchError
from quartet.core.batch import Batch

__all__ = [
    "DataRank",
    "DispatchSpec",
    "Split",
    "check_layout",
    "declared_methods",
    "dispatch",
    "join_outputs",
    "split_inputs",
]

P = ParamSpec("P")
R = TypeVar("R")
DISPATCH_ATTR = "__quartet_dispatch__"


class Split(StrEnum):
    """How the driver spreads one call over the ranks of a group."""

    BY_DP_RANK = "by_dp_rank"
    BROADCAST = "broadcast"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class DispatchSpec:
    """The declaration attached to a role method by `@dispatch`."""

    split: Split


@dataclass(frozen=True)
class DataRank:
    """Which data-parallel chunk a rank receives, and whether the driver keeps its output."""

    dp_rank: int
    dp_size: int
    collect: bool = True


def check_layout(role: str, layout: list[DataRank]) -> None:
    """Every data-parallel rank must have exactly one collecting rank, and all ranks one dp size."""
    sizes = {d.dp_size for d in layout}
    if len(sizes) != 1:
        raise DispatchError(f"role '{role}': ranks disagree on the data-parallel size: {sorted(sizes)}")
    size = sizes.pop()
    for dp in range(size):
        collectors = [r for r, d in enumerate(layout) if d.dp_rank == dp and d.collect]
        members = [r for r, d in enumerate(layout) if d.dp_rank == dp]
        if not members or len(collectors) != 1:
            raise DispatchError(
                f"role '{role}': data-parallel rank {dp} of {size} has ranks {members} and collecting "
                f"ranks {collectors}; each needs exactly one collecting rank (data_rank() of the role)"
            )
    stray = [r for r, d in enumerate(layout) if not 0 <= d.dp_rank < size]
    if stray:
        raise DispatchError(f"role '{role}': ranks {stray} have a data-parallel rank outside [0, {size})")


def dispatch(split: Split) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Declare a role method callable from the driver, with how its call is split over the ranks."""
    if not isinstance(split, Split):
        raise DispatchError(f"@dispatch needs a Split member, got {split!r}")

    def mark(fn: Callable[P, R]) -> Callable[P, R]:
        setattr(fn, DISPATCH_ATTR, DispatchSpec(split))
        return fn

    return mark


def declared_methods(cls: type) -> dict[str, DispatchSpec]:
    """Every method of `cls` (and its bases) declared with `@dispatch`."""
    out: dict[str, DispatchSpec] = {}
    for name, member in inspect.getmembers(cls, predicate=callable):
        spec = getattr(member, DISPATCH_ATTR, None)
        if isinstance(spec, DispatchSpec):
            out[name] = spec
    return out


def split_inputs(
    split: Split, world: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[tuple[tuple[Any, ...], dict[str, Any]]], int]:
    """Per-chunk (args, kwargs) for `world` data-parallel ranks, and the padding rows added to Batches."""
    if split is not Split.BY_DP_RANK:
        return [(args, kwargs)] * (1 if split is Split.RANK_ZERO else world), 0
    pads = set()

    def cut(value: Any) -> list[Any]:
        if not isinstance(value, Batch):
            return [value] * world
        padded, pad = value.pad_to_divisor(world)
        pads.add((len(value), pad))
        return padded.chunk(world)

    arg_parts = [cut(a) for a in args]
    kw_parts = {k: cut(v) for k, v in kwargs.items()}
    if len(pads) > 1:
        raise DispatchError(
            f"Batch arguments of one split call must have the same length, got {sorted(pads)}"
        )
    per_rank = [
        (tuple(p[r] for p in arg_parts), {k: v[r] for k, v in kw_parts.items()}) for r in range(world)
    ]
    return per_rank, next(iter(pads))[1] if pads else 0


def join_outputs(split: Split, outputs: list[Any], pad: int) -> Any:
    """Join the collecting ranks' outputs (in rank order) as `split` declares."""
    if split is Split.RANK_ZERO:
        return outputs[0]
    if split is Split.BY_DP_RANK and outputs and all(isinstance(o, Batch) for o in outputs):
        return Batch.concat(outputs).unpad(pad)
    return outputs
