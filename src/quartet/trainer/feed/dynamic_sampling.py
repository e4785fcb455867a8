"""DAPO's dynamic sampling in the driver: keep drawing prompts until the batch is full of informative groups.

With group-relative estimators a prompt whose n responses all got the same reward has advantage 0 for every
token: it costs a training pass and teaches nothing. With `algorithm.filter_groups` the driver drops such
groups (`quartet.core.reward_shaping.dynamic_sampling_filter`) and generates on fresh prompts, up to
`algorithm.max_num_gen_batches` generation batches per step, until `data.train_batch_size` groups remain.

Departure from verl: when the draws run out verl raises; quartet fills the missing groups with dropped ones
(they add nothing to the policy gradient, and the batch keeps the size that the mini-batch split needs) and
reports how many in `dynamic_sampling/padded_groups`, so a run over an easy or hard dataset slows down
visibly instead of stopping.
"""

from __future__ import annotations

from collections.abc import Callable

from quartet.core.batch import Batch
from quartet.core.reward_shaping import dynamic_sampling_filter
from quartet.rollout.batch_io import concat_rollouts

__all__ = ["fill_informative_groups"]


def fill_informative_groups(
    first: Batch,
    groups_wanted: int,
    samples_per_group: int,
    generate_more: Callable[[int], Batch] | None,
    max_batches: int,
    pad_token_id: int,
) -> tuple[Batch, dict[str, float]]:
    """A batch of `groups_wanted` groups, informative ones first, from `first` and further draws.

    Args:
        first: the step's scored rollout (`token_level_scores`, `uid`), groups of `samples_per_group`
            consecutive rows.
        generate_more: draw k (1, 2, ...) -> another scored rollout on fresh prompts with fresh uids;
            None: filter `first` only.
        max_batches: generation batches at most, `first` included.
    """
    kept: list[Batch] = []
    dropped: list[Batch] = []
    kept_groups = dropped_groups = 0
    batch, draws = first, 1
    while True:
        result = dynamic_sampling_filter(batch["token_level_scores"].sum(-1), batch.non_tensors["uid"])
        kept.append(batch.index(result.keep))
        dropped.append(batch.index(~result.keep))
        kept_groups += result.kept_groups
        dropped_groups += result.dropped_groups
        if kept_groups >= groups_wanted or generate_more is None or draws >= max_batches:
            break
        batch = generate_more(draws)
        draws += 1
    padded_groups = max(0, groups_wanted - kept_groups)
    rows = groups_wanted * samples_per_group
    full = concat_rollouts([*kept, *dropped], pad_token_id).slice(0, rows)
    metrics = {
        "dynamic_sampling/kept_groups": float(kept_groups),
        "dynamic_sampling/dropped_groups": float(dropped_groups),
        "dynamic_sampling/gen_batches": float(draws),
        "dynamic_sampling/padded_groups": float(padded_groups),
    }
    return full, metrics
