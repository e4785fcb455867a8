"""What the trainable roles share: mini-batch schedule, optimizer-step count, metric reduction."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch

from quartet.config.roles import ActorConfig, CriticConfig
from quartet.core.batch import Batch
from quartet.engines import MicroSpec
from quartet.roles.run_values import RunValues

__all__ = ["mean_metrics", "mini_batches", "optimizer_steps", "train_micro_spec"]


def train_micro_spec(rc: ActorConfig | CriticConfig) -> MicroSpec:
    """Micro-batching of forward/backward in an update, as the role's config states it."""
    budget = rc.max_tokens_per_micro_batch if rc.use_dynamic_batch else None
    return MicroSpec(size=rc.micro_batch_size_per_device, max_tokens=budget)


def optimizer_steps(run: RunValues, rc: ActorConfig | CriticConfig) -> int:
    """Optimizer steps of a run: trainer steps x epochs x mini-batches per step (for the lr schedule)."""
    return run.trainer_steps * rc.epochs * max(1, run.prompts_per_step // rc.mini_batch_size)


def mini_batches(
    batch: Batch, rows_per_mini_batch: int, shuffle: bool, generator: torch.Generator
) -> Iterator[Batch]:
    """This rank's rows cut into mini-batches of `rows_per_mini_batch`, in a shuffled order if asked.

    Every rank gets the same number of rows (the driver's split pads), so every rank takes the same
    number of optimizer steps, which the collectives of a sharded model need.
    """
    n = len(batch)
    if rows_per_mini_batch < 1 or n % rows_per_mini_batch:
        raise ValueError(
            f"{n} rows on this rank do not split into mini-batches of {rows_per_mini_batch} rows; "
            "check <role>.mini_batch_size x rollout.n / cluster.world_size"
        )
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for start in range(0, n, rows_per_mini_batch):
        yield batch.index(order[start : start + rows_per_mini_batch])


def mean_metrics(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean of each metric over optimizer steps (keys missing from a step are averaged over the others)."""
    sums: dict[str, list[float]] = {}
    for step in steps:
        for key, value in step.items():
            sums.setdefault(key, []).append(float(value))
    return {key: sum(values) / len(values) for key, values in sums.items()}
