"""Where a step's scored batch comes from: the one seam between generation and the step's training.

    batch = source.take(step, version, timer)   # SourcedBatch: scored batch, metrics, sampler state, waits
    trained = runner.run(source, step)          # the driver's step, whatever the source

Two sources exist:

- `SyncGeneration` (`trainer.mode=sync`): the step's prompts are drawn and generated now (phase `gen`:
  with ReMax also a greedy baseline), scored (phase `reward`), and with DAPO's dynamic sampling
  (`algorithm.filter_groups`) further prompts are drawn until enough groups are informative;
- `RolloutFeed` (`trainer.mode=one_step_off|async`, `quartet.trainer.feed.rollout_feed`): the batch was
  generated ahead on the rollout's own pool while earlier steps trained; `gen` is the wait for it.

Either one hands the step the sampler state to checkpoint with it (the sampler right after the step's
draws) and the wall-clock spans the driver waited for generation (the pools' idle and overlap times,
`quartet.trainer.records.busy_time`). A source is a context manager: the run enters it for as long as it
runs. Both score their rollouts with a `RolloutScorer`: the reward model first when the run has one, then
the rule scorers or the user's function (`quartet.rewards`), as phase `reward`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from quartet.agents.batch import agent_batch_metrics
from quartet.cluster.group import RoleGroup
from quartet.config import QuartetConfig
from quartet.core.batch import Batch
from quartet.roles.reward_model import RewardModel
from quartet.roles.rollout import Rollout
from quartet.trainer.feed.dynamic_sampling import fill_informative_groups
from quartet.trainer.records.busy_time import Interval
from quartet.trainer.records.phase_timer import PhaseTimer
from quartet.trainer.workers.rollout_calls import RolloutCalls
from quartet.trainer.workers.start import Workers

if TYPE_CHECKING:
    from quartet.rewards.compute import RewardComputer

__all__ = ["BatchSource", "PromptDraw", "RolloutScorer", "SourcedBatch", "SyncGeneration"]

PromptDraw = Callable[[int, int], Batch]
"""`draw(step, k)`: the step's k-th prompt batch (k = 0 first; 1, 2, ... dynamic sampling's extra draws,
with fresh uids), drawn from the sampler in order."""


@dataclass
class SourcedBatch:
    """What a source hands the step: its scored batch and what the driver records with it."""

    batch: Batch
    metrics: dict[str, float]
    sampler_state: dict[str, Any]
    """The sampler right after this step's draws: what a checkpoint of the step saves."""
    gen_waits: list[Interval] = field(default_factory=list)
    """Wall-clock spans (`time.time()`) the driver waited for generation in this step."""


class BatchSource(ABC):
    """Scored batches for the steps, in step order (see the module docstring)."""

    @abstractmethod
    def take(self, step: int, version: int, timer: PhaseTimer) -> SourcedBatch:
        """Step `step`'s scored batch, for a trainer whose weights are at `version`; phases `gen` and
        `reward` are timed by `timer`."""

    def __enter__(self) -> BatchSource:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class RolloutScorer:
    """`token_level_scores` (and `scores`) of generated responses, with the agent loops' metrics."""

    def __init__(
        self, cfg: QuartetConfig, reward_model: RoleGroup[RewardModel] | None, reward: RewardComputer
    ) -> None:
        self.reward_model = reward_model
        self.reward = reward
        self.n = cfg.rollout.n
        self.success_score = cfg.rollout.multi_turn.success_score

    def score(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """`batch` with its scores: the reward model's `rm_scores` first, then the rule scorers'."""
        if self.reward_model is not None:
            scored = self.reward_model.call_batch(RewardModel.score, batch)
            batch = batch.union(scored.select("rm_scores"))
        scored, metrics = self.reward.score(batch)
        return batch.union(scored), dict(metrics)

    def score_rollout(
        self, batch: Batch, timer: PhaseTimer, baseline: Batch | None = None
    ) -> tuple[Batch, dict[str, float]]:
        """Phase `reward`: scores, agent metrics and (ReMax) the scored greedy baseline of a rollout."""
        with timer("reward"):
            batch, metrics = self.score(batch)
            metrics |= agent_batch_metrics(batch, self.success_score)
            if baseline is not None:
                scored_baseline, _ = self.score(baseline)
                baseline_scores = scored_baseline["token_level_scores"].sum(-1)
                batch = batch.union(Batch({"reward_baselines": baseline_scores.repeat_interleave(self.n)}))
        return batch, metrics


class SyncGeneration(BatchSource):
    """Generate and score each step's prompts when the step asks (`trainer.mode=sync`)."""

    def __init__(
        self,
        cfg: QuartetConfig,
        workers: Workers,
        scorer: RolloutScorer,
        draw: PromptDraw,
        sampler_state: Callable[[], dict[str, Any]] = dict,
        pad_id: int = 0,
        rollout: RolloutCalls | None = None,
    ) -> None:
        """`sampler_state()`: the sampler's state now; `pad_id` pads prompts/responses when dynamic
        sampling joins rollouts of different widths; `rollout`: the calls on the rollout group (the
        healing view with recovery on, `quartet.trainer.recovery`; None: the plain group of `workers`)."""
        self.workers = workers
        self.rollout = rollout if rollout is not None else RolloutCalls(workers.rollout)
        self.scorer = scorer
        self.draw = draw
        self.sampler_state = sampler_state
        self.n = cfg.rollout.n
        self.max_batches = cfg.algorithm.max_num_gen_batches
        self.pad_id = pad_id

    def take(self, step: int, version: int, timer: PhaseTimer) -> SourcedBatch:
        waits: list[Interval] = []
        prompts = self.draw(step, 0)
        batch, metrics = self._rollout(prompts, timer, waits)
        if self.workers.plan.dynamic_sampling:

            def extra(k: int) -> Batch:
                return self._rollout(self.draw(step, k), timer, waits)[0]

            batch, filter_metrics = fill_informative_groups(
                batch, len(prompts), self.n, extra, self.max_batches, self.pad_id
            )
            metrics |= filter_metrics
        return SourcedBatch(batch, metrics, self.sampler_state(), waits)

    def _rollout(
        self, prompts: Batch, timer: PhaseTimer, waits: list[Interval]
    ) -> tuple[Batch, dict[str, float]]:
        """Generate `rollout.n` responses per prompt and score them (phases `gen`, `reward`)."""
        with timer("gen"):
            began = time.time()
            batch = self.rollout.call_batch(Rollout.generate, prompts, greedy=False)
            greedy = self.workers.plan.greedy_baseline
            baseline = self.rollout.call_batch(Rollout.generate, prompts, greedy=True) if greedy else None
            waits.append((began, time.time()))
        return self.scorer.score_rollout(batch, timer, baseline)
