"""One RL step as the algorithm reads: named, timed phases over one batch.

    generate -> reward -> (balance) -> old log-probs -> reference log-probs -> values
             -> advantages -> critic update -> actor update -> weight sync

Each phase is one call on a role group (or a pure function of `quartet.core` on the driver); its wall time
is logged as `timing_s/<phase>` (verl's names). Roles that the algorithm does not need are absent and their
phases skipped: no reference without a KL term, no critic without GAE.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quartet.agents.batch import agent_batch_metrics
from quartet.config import QuartetConfig, TrainerMode, WeightApply
from quartet.config.plan import OldLogprobs, RefLogprobs
from quartet.core.advantages import AdvantageInputs, AdvantageParams, compute_advantages
from quartet.core.balance import balanced_order
from quartet.core.batch import Batch
from quartet.core.kl import KLController, apply_kl_penalty, make_kl_controller
from quartet.core.metrics import batch_data_metrics, logprob_diff_metrics, masked_mean
from quartet.core.turn_credit import turn_level_advantages
from quartet.roles.actor import Actor
from quartet.roles.critic import Critic
from quartet.roles.reward_model import RewardModel
from quartet.roles.rollout import Rollout
from quartet.trainer.dynamic_sampling import fill_informative_groups
from quartet.trainer.workers import Workers, mean_over_ranks

if TYPE_CHECKING:
    from quartet.rewards.compute import RewardComputer

__all__ = ["PhaseTimer", "StepRunner", "kl_controller", "mean_over_ranks"]


@dataclass
class PhaseTimer:
    """Wall time of named phases: `timing_s/<name>`."""

    seconds: dict[str, float] = field(default_factory=dict)
    on_enter: Callable[[str], None] | None = None
    """Told the name of each phase as it starts (the console's progress bar shows it)."""

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.on_enter is not None:
            self.on_enter(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[f"timing_s/{name}"] = self.seconds.get(f"timing_s/{name}", 0.0) + (
                time.perf_counter() - start
            )


def kl_controller(cfg: QuartetConfig) -> KLController:
    """The in-reward KL coefficient controller of `algorithm.kl_ctrl`."""
    k = cfg.algorithm.kl_ctrl
    return make_kl_controller(k.kind, k.coef, k.target_kl, k.horizon)


class StepRunner:
    """Runs training steps with the run's workers, reward computer and KL controller."""

    def __init__(
        self,
        cfg: QuartetConfig,
        workers: Workers,
        reward: RewardComputer,
        kl_ctrl: KLController,
        pad_id: int = 0,
        on_phase: Callable[[str], None] | None = None,
        weight_version: int = 0,
    ) -> None:
        self.cfg, self.workers, self.reward, self.kl_ctrl = cfg, workers, reward, kl_ctrl
        self.on_phase = on_phase
        self.weight_version = weight_version
        """Actor updates so far: the version of the weights the last sync sent (0: the initial model)."""
        one_step_off = cfg.trainer.mode is TrainerMode.ONE_STEP_OFF
        self.apply = WeightApply.AFTER_DRAIN if one_step_off else None
        """one_step_off: the batch generating during the update keeps the weights it started with."""
        self.gen_waits: list[tuple[float, float]] = []
        """Wall-clock spans the driver waited for generation in the current step (sync mode)."""
        self.pad_id = pad_id
        """Padding of prompts/responses when dynamic sampling joins rollouts of different widths."""
        self.estimator = cfg.algorithm.adv_estimator
        self.params = AdvantageParams(
            gamma=cfg.algorithm.gamma,
            lam=cfg.algorithm.lam,
            norm_adv_by_std=cfg.algorithm.norm_adv_by_std,
            whiten=cfg.algorithm.whiten_advantages,
        )

    def score(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """`token_level_scores` (and `scores`) of the responses: reward model and/or rule scorers."""
        if self.workers.reward_model is not None:
            scored = self.workers.reward_model.call_batch(RewardModel.score, batch)
            batch = batch.union(scored.select("rm_scores"))
        scored, metrics = self.reward.score(batch)
        return batch.union(scored), dict(metrics)

    def run(
        self, prompts: Batch, step: int, more_prompts: Callable[[int], Batch] | None = None
    ) -> tuple[Batch, dict[str, float]]:
        """One step over `prompts` (with a `uid` column); the trained batch and the step's metrics.

        `more_prompts(k)` gives the k-th extra prompt batch (fresh uids) that DAPO's dynamic sampling
        (`algorithm.filter_groups`) draws when too few groups are informative.
        """
        cfg, plan, timer = self.cfg, self.workers.plan, self.timer()
        start, window_start = time.perf_counter(), time.time()
        self.gen_waits = []
        batch, metrics = self._rollout(prompts, timer)
        if plan.dynamic_sampling:
            extra = None if more_prompts is None else lambda k: self._rollout(more_prompts(k), timer)[0]
            batch, filter_metrics = fill_informative_groups(
                batch, len(prompts), cfg.rollout.n, extra, cfg.algorithm.max_num_gen_batches, self.pad_id
            )
            metrics |= filter_metrics
        batch, metrics = self.train(batch, step, metrics, timer, start)
        if self.workers.rollout_separate:
            metrics |= self.workers.pool_metrics((window_start, time.time()), self.gen_waits)
        return batch, metrics

    def timer(self) -> PhaseTimer:
        """A fresh phase timer that reports each phase as it starts."""
        return PhaseTimer(on_enter=self.on_phase)

    def train(
        self, batch: Batch, step: int, metrics: dict[str, float], timer: PhaseTimer, start: float
    ) -> tuple[Batch, dict[str, float]]:
        """The step after generation and scoring: log-probs, advantages, updates, weight sync; `start` is
        the step's `time.perf_counter()` start (its wall time is `timing_s/step`)."""
        plan, w = self.workers.plan, self.workers
        if plan.sleep_rollout and not w.rollout_separate:
            w.rollout.call(Rollout.sleep)
        batch = self._balance(batch)
        if plan.old_logprobs is OldLogprobs.ACTOR_PASS:  # else the update's own log-probs (and metrics)
            with timer("old_log_prob"):
                batch = batch.union(w.actor.call_batch(Actor.compute_logprobs, batch))
            if "entropy" in batch:  # verl logs the rollout's entropy from the old-log-prob pass
                metrics["actor/entropy"] = float(masked_mean(batch["entropy"], batch["response_mask"]))
            if "rollout_logprobs" in batch:
                metrics |= logprob_diff_metrics(
                    batch["rollout_logprobs"], batch["old_logprobs"], batch["response_mask"]
                )
        if plan.ref_logprobs is not RefLogprobs.NONE:
            with timer("ref"):
                batch = batch.union(w.ref_logprobs(batch))
        if w.critic is not None:
            with timer("values"):
                batch = batch.union(w.critic.call_batch(Critic.compute_values, batch))
        with timer("adv"):
            batch, adv_metrics = self._advantages(batch)
            metrics |= adv_metrics
        if w.critic is not None:
            with timer("update_critic"):
                metrics |= mean_over_ranks(w.critic.call(Critic.update, batch))
        if plan.updates_actor(step):
            with timer("update_actor"):
                metrics |= mean_over_ranks(w.actor.call(Actor.update, batch))
            with timer("update_weights"):
                self.weight_version += 1
                metrics |= w.sync_weights(self.weight_version, self.apply)
        timer.seconds["timing_s/step"] = time.perf_counter() - start
        metrics |= self._data_metrics(batch) | timer.seconds | self._throughput(batch, timer.seconds)
        return batch, metrics

    def _rollout(self, prompts: Batch, timer: PhaseTimer) -> tuple[Batch, dict[str, float]]:
        """Generate `rollout.n` responses per prompt and score them (phases `gen`, `reward`)."""
        w = self.workers
        with timer("gen"):
            began = time.time()
            batch = w.rollout.call_batch(Rollout.generate, prompts)
            greedy = self.workers.plan.greedy_baseline
            baseline = w.rollout.call_batch(Rollout.generate, prompts, greedy=True) if greedy else None
            self.gen_waits.append((began, time.time()))
        return self.score_rollout(batch, timer, baseline)

    def score_rollout(
        self, batch: Batch, timer: PhaseTimer, baseline: Batch | None = None
    ) -> tuple[Batch, dict[str, float]]:
        """Phase `reward`: scores, agent metrics and (ReMax) the scored greedy baseline of a rollout."""
        n = self.cfg.rollout.n
        with timer("reward"):
            batch, metrics = self.score(batch)
            metrics |= agent_batch_metrics(batch, self.cfg.rollout.multi_turn.success_score)
            if baseline is not None:
                scored_baseline, _ = self.score(baseline)
                baseline_scores = scored_baseline["token_level_scores"].sum(-1)
                batch = batch.union(Batch({"reward_baselines": baseline_scores.repeat_interleave(n)}))
        return batch, metrics

    def _balance(self, batch: Batch) -> Batch:
        """Reorder rows so every data-parallel rank gets about the same number of tokens."""
        dp = self.workers.actor.dp_size
        if dp == 1 or len(batch) % dp:
            return batch
        return batch.reorder(balanced_order(batch["attention_mask"].sum(-1), dp))

    def _advantages(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        cfg, mask = self.cfg, batch["response_mask"]
        rewards, metrics = batch["token_level_scores"], {}
        if self.workers.plan.kl_in_reward:
            penalty = apply_kl_penalty(
                rewards,
                batch["old_logprobs"],
                batch["ref_logprobs"],
                mask,
                coef=self.kl_ctrl.value,
                kind=cfg.algorithm.kl_penalty,
            )
            self.kl_ctrl.update(penalty.current_kl, n_steps=len(batch))
            rewards, metrics = penalty.token_level_rewards, dict(penalty.metrics)
        turn_coef = cfg.algorithm.turn_reward_coef
        group_turn_credit = turn_coef > 0 and "turn_rewards" in batch and cfg.algorithm.needs_group
        if turn_coef > 0 and "turn_rewards" in batch and not cfg.algorithm.needs_group:
            rewards = rewards + turn_coef * batch["turn_rewards"] * mask  # their returns carry it back
        out = compute_advantages(
            self.estimator,
            AdvantageInputs(
                token_level_rewards=rewards,
                response_mask=mask,
                values=batch.get("values", None),
                index=batch.non_tensors["uid"],
                reward_baselines=batch.get("reward_baselines", None),
            ),
            self.params,
        )
        metrics |= out.metrics
        advantages, returns = out.advantages, out.returns
        if group_turn_credit:
            turn_adv = turn_level_advantages(
                batch["turn_rewards"],
                mask,
                batch.non_tensors["uid"],
                gamma=cfg.algorithm.turn_gamma,
                norm_by_std=cfg.algorithm.norm_adv_by_std,
            ).to(advantages.dtype)
            advantages = advantages + turn_coef * turn_adv
            returns = advantages  # outcome estimators return their advantages as returns
            metrics["critic/turn_advantages/abs_mean"] = float(masked_mean(turn_adv.abs(), mask))
        columns = {"token_level_rewards": rewards, "advantages": advantages, "returns": returns}
        return batch.union(Batch(columns)), metrics

    def _data_metrics(self, batch: Batch) -> dict[str, float]:
        prompt_width = batch["prompts"].shape[1]
        return batch_data_metrics(
            batch["token_level_scores"],
            batch["token_level_rewards"],
            batch["advantages"],
            batch["returns"],
            batch["response_mask"],
            values=batch.get("values", None),
            max_response_length=self.cfg.data.max_response_length,
            prompt_lengths=batch["attention_mask"][:, :prompt_width].sum(-1),
            max_prompt_length=self.cfg.data.max_prompt_length,
        )

    def _throughput(self, batch: Batch, seconds: dict[str, float]) -> dict[str, float]:
        tokens = float(batch["attention_mask"].sum())
        world = self.workers.actor.world_size
        return {
            "perf/total_num_tokens": tokens,
            "perf/throughput": tokens / max(seconds["timing_s/step"], 1e-9) / world,
            "perf/generated_tokens": float(batch["response_mask"].sum()),
        }
