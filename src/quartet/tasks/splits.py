"""Held-out splits of drawn problems: validation problems that training never contains.

Shared by the tasks whose problems are drawn one at a time from a random stream (calculator, word
problems): validation accuracy then measures answers to unseen problems, not recall.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from typing import TypeVar

__all__ = ["distinct_split"]

ProblemT = TypeVar("ProblemT")


def distinct_split(
    draw: Callable[[random.Random], ProblemT],
    key: Callable[[ProblemT], Hashable],
    train_size: int,
    val_size: int,
    seed: int,
) -> tuple[list[ProblemT], list[ProblemT]]:
    """(train, val): `val_size` problems with distinct keys drawn from `Random(seed)`, then `train_size`
    problems drawn from `Random(seed + 1)` whose keys are none of theirs (repeats among them allowed)."""
    rng = random.Random(seed)
    val: list[ProblemT] = []
    seen: set[Hashable] = set()
    while len(val) < val_size:
        problem = draw(rng)
        if key(problem) not in seen:
            seen.add(key(problem))
            val.append(problem)
    rng = random.Random(seed + 1)
    train: list[ProblemT] = []
    while len(train) < train_size:
        problem = draw(rng)
        if key(problem) not in seen:
            train.append(problem)
    return train, val
