"""One training step whose batch was generated ahead, on the rollout's own pool (`trainer.mode`).

    feed = make_feed(cfg, workers, data.train, sampler, total, pad_id)     # None for trainer.mode=sync
    batch, metrics, sampler_state = overlapped_step(runner, feed, step)

The phases read as in sync mode, but `gen` is only the wait for a batch that was generating while the
previous step trained; the step adds the `async/*` metrics of the feed and the pools' idle and overlap
times (`quartet.trainer.overlap`).
"""

from __future__ import annotations

import time
from typing import Any

from quartet.config import QuartetConfig, TrainerMode
from quartet.core.batch import Batch
from quartet.data.prompts import PromptDataset
from quartet.data.sampler import PromptSampler
from quartet.trainer.rl_data import prompt_batch
from quartet.trainer.rollout_feed import RolloutFeed
from quartet.trainer.step import StepRunner
from quartet.trainer.workers import Workers

__all__ = ["make_feed", "overlapped_step"]


def make_feed(
    cfg: QuartetConfig,
    workers: Workers,
    dataset: PromptDataset,
    sampler: PromptSampler,
    total_steps: int,
    pad_id: int,
) -> RolloutFeed | None:
    """The feed of `trainer.mode` one_step_off (depth 1, no staleness check: it is 1 by construction) or
    async (depth `async_buffer`, stale groups regenerated); None in sync mode."""
    mode = cfg.trainer.mode
    if mode is TrainerMode.SYNC:
        return None

    def draw(step: int) -> Batch:
        return prompt_batch(dataset, sampler.next_indices(), step)

    one_step_off = mode is TrainerMode.ONE_STEP_OFF
    return RolloutFeed(
        workers,
        draw,
        sampler.state_dict,
        depth=1 if one_step_off else cfg.trainer.async_buffer,
        max_staleness=None if one_step_off else cfg.trainer.max_staleness,
        last_step=total_steps,
        pad_id=pad_id,
    )


def overlapped_step(
    runner: StepRunner, feed: RolloutFeed, step: int
) -> tuple[Batch, dict[str, float], dict[str, Any]]:
    """Train step `step` on the feed's batch; the trained batch, the metrics and the sampler state to
    checkpoint with the step."""
    timer, start, window_start = runner.timer(), time.perf_counter(), time.time()
    with timer("gen"):
        fed = feed.take(step, runner.weight_version)
    batch, metrics = runner.score_rollout(fed.batch, timer)
    metrics |= fed.metrics
    batch, metrics = runner.train(batch, step, metrics, timer, start)
    metrics |= runner.workers.pool_metrics((window_start, time.time()), [fed.waited])
    return batch, metrics, fed.sampler_state
