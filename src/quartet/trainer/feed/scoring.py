"""Scoring a step's generated responses: the reward model first when the run has one, then the rule
scorers or the user's function (`quartet.rewards`), as phase `reward`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quartet.agents.batch import agent_batch_metrics
from quartet.cluster.group import RoleGroup
from quartet.config import QuartetConfig
from quartet.core.batch import Batch
from quartet.roles.reward_model import RewardModel
from quartet.trainer.records.phase_timer import PhaseTimer

if TYPE_CHECKING:
    from quartet.rewards.compute import RewardComputer

__all__ = ["RolloutScorer"]


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
