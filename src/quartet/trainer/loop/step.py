"""One RL step as the algorithm reads: named, timed phases over one batch.

    generate -> reward -> (balance) -> old log-probs -> reference log-probs -> values
             -> advantages -> critic update -> actor update -> weight sync

Each phase is one call on a role group (or a pure function of `quartet.core` on the driver); its wall time
is logged as `timing_s/<phase>` (verl's names). Roles that the algorithm does not need are absent and their
phases skipped: no reference without a KL term, no critic without GAE.

    trained = StepRunner(cfg, workers, weights, kl_ctrl).run(source, step)

Generation and scoring come from a `BatchSource` (`quartet.trainer.feed.batch_source`): generated now in sync
mode, or ahead on the rollout's own pool (`trainer.mode=one_step_off|async`); every mode runs this one
path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from quartet.config import AlarmMode, QuartetConfig
from quartet.config.plan import OldLogprobs, RefLogprobs, plan_step
from quartet.core.advantages import AdvantageInputs, AdvantageParams, compute_advantages
from quartet.core.balance import balanced_order
from quartet.core.batch import Batch
from quartet.core.distill import distill_metrics, reverse_kl_advantages
from quartet.core.kl import KLController, apply_kl_penalty, make_kl_controller
from quartet.core.metrics import (
    batch_data_metrics,
    logprob_diff_metrics,
    masked_mean,
    source_score_metrics,
)
from quartet.core.routing import ROUTING_MISMATCH, mismatch_share
from quartet.core.turn_credit import turn_level_advantages
from quartet.roles.actor import Actor
from quartet.roles.critic import Critic
from quartet.roles.reference import Reference
from quartet.roles.remote_teacher import RemoteTeacher
from quartet.roles.rollout import Rollout
from quartet.roles.teacher import Teacher
from quartet.trainer.feed.batch_source import BatchSource
from quartet.trainer.loop.mismatch_alarm import MismatchAlarm, MismatchAlarmError, MismatchWatch
from quartet.trainer.loop.no_signal_alarm import NO_SIGNAL_METRIC, NoSignalAlarm, NoSignalWatch
from quartet.trainer.records.busy_time import Interval, busy_outside, pool_metrics
from quartet.trainer.records.phase_timer import PhaseDeadlines, PhaseTimer
from quartet.trainer.workers.rollout_calls import RolloutCalls
from quartet.trainer.workers.start import Workers, mean_over_ranks
from quartet.trainer.workers.weight_sync import WeightSync

__all__ = ["StepRunner", "TrainedStep", "kl_controller"]

log = logging.getLogger(__name__)


@dataclass
class TrainedStep:
    """What one step gives the driver."""

    batch: Batch
    """The trained batch, with its advantages and returns."""
    metrics: dict[str, float]
    sampler_state: dict[str, Any]
    """The sampler right after the step's draws: what a checkpoint of the step saves."""


def kl_controller(cfg: QuartetConfig) -> KLController:
    """The in-reward KL coefficient controller of `algorithm.kl_ctrl`."""
    k = cfg.algorithm.kl_ctrl
    return make_kl_controller(k.kind, k.coef, k.target_kl, k.horizon, k.min_coef)


class StepRunner:
    """Runs training steps with the run's workers, weight sync and KL controller, on batches of a source."""

    def __init__(
        self,
        cfg: QuartetConfig,
        workers: Workers,
        weights: WeightSync,
        kl_ctrl: KLController,
        on_phase: Callable[[str], None] | None = None,
        weight_version: int = 0,
        on_alarm: Callable[[MismatchAlarm | NoSignalAlarm], None] | None = None,
        rollout: RolloutCalls | None = None,
    ) -> None:
        """`on_phase(name)` is told each phase as it starts; `on_alarm(alarm)` each step's tripped log-prob
        mismatch alarm (`trainer.mismatch_alarm`), before `stop` raises it, and the no-signal alarm on the
        step it trips (`trainer.no_signal_steps`); `rollout`: the calls on the
        rollout group, with `weights` the run's (the healing pair with recovery on,
        `quartet.trainer.recovery`; None: the plain group of `workers`)."""
        self.cfg = cfg
        self.workers = workers
        self.weights = weights
        self.kl_ctrl = kl_ctrl
        self.on_phase = on_phase
        self.on_alarm = on_alarm
        self._rollout = rollout
        self.watch = MismatchWatch.from_config(cfg)
        """The log-prob mismatch checks of each step (`quartet.trainer.loop.mismatch_alarm`)."""
        self.signal = NoSignalWatch.from_config(cfg)
        """The streaks of steps without a learning signal (`quartet.trainer.loop.no_signal_alarm`)."""
        self.weight_version = weight_version
        """Actor updates so far: the version of the weights the last sync sent (0: the initial model)."""
        self.apply = plan_step(cfg).weight_apply
        """When the replicas apply each sync's weights (one_step_off: after draining, so the batch generating
        during the update keeps the weights it started with)."""
        self.deadlines = PhaseDeadlines(
            cfg.trainer.hang_timeout_s, cfg.cluster.call_timeout_s, cfg.trainer.run_dir
        )
        """Each phase's hang deadline, from the phase's earlier times in this run (`hang_deadline`)."""
        gkd_k = cfg.algorithm.gkd_top_k if cfg.algorithm.gkd_coef > 0 else 0
        self.remote_teacher = RemoteTeacher(cfg.teacher, top_k=gkd_k) if cfg.teacher.url else None
        """The teacher at `teacher.url` (`quartet.roles.remote_teacher`); None: local or none."""
        self.estimator = cfg.algorithm.adv_estimator
        self.params = AdvantageParams(
            gamma=cfg.algorithm.gamma,
            lam=cfg.algorithm.lam,
            norm_adv_by_std=cfg.algorithm.norm_adv_by_std,
            whiten=cfg.algorithm.whiten_advantages,
        )

    @property
    def rollout(self) -> RolloutCalls:
        """The calls on the rollout group this runner makes (see `__init__`)."""
        return self._rollout if self._rollout is not None else RolloutCalls(self.workers.rollout)

    def run(self, source: BatchSource, step: int) -> TrainedStep:
        """Step `step`: its scored batch from `source` (phases `gen`, `reward`), then log-probs, advantages,
        updates and weight sync; with the rollout on its own pool, the pools' idle and overlap times."""
        timer = PhaseTimer(on_enter=self.on_phase, guard=self.deadlines.guard(step))
        start, window_start = time.perf_counter(), time.time()
        got = source.take(step, self.weight_version, timer)
        batch, metrics = self._train(got.batch, step, got.metrics, timer, start)
        if self.workers.rollout_separate:
            metrics |= self._pool_metrics((window_start, time.time()), got.gen_waits)
        metrics |= self.rollout.step_metrics()
        return TrainedStep(batch, metrics, got.sampler_state)

    def _train(
        self, batch: Batch, step: int, metrics: dict[str, float], timer: PhaseTimer, start: float
    ) -> tuple[Batch, dict[str, float]]:
        """The step after generation and scoring: log-probs, advantages, updates, weight sync; `start` is
        the step's `time.perf_counter()` start (its wall time is `timing_s/step`)."""
        plan, w = self.workers.plan, self.workers
        if plan.sleep_rollout and not w.rollout_separate:
            self.rollout.call(Rollout.sleep)
        batch = self._balance(batch)
        self.watch.check_drift(batch)
        if plan.old_logprobs is OldLogprobs.ACTOR_PASS:  # else the update's own log-probs (and metrics)
            batch = self._old_logprobs(batch, metrics, timer)
            self._sound(step, metrics)  # before any update: `stop` leaves the roles at the last step
        if plan.ref_logprobs is not RefLogprobs.NONE:
            with timer("ref"):
                batch = batch.union(self._ref_logprobs(batch))
        if w.teacher is not None:
            with timer("teacher"):
                batch = batch.union(w.teacher.call_batch(Teacher.compute_teacher_logprobs, batch))
        elif self.remote_teacher is not None:
            with timer("teacher"):
                batch = batch.union(self.remote_teacher.score(batch))
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
                metrics |= self.weights.sync(self.weight_version, self.apply)
        if plan.old_logprobs is OldLogprobs.UPDATE:
            if "rollout/logprob_diff_mean" in metrics and not plan.generation_ahead:
                self.watch.check_update_mean(metrics["rollout/logprob_diff_mean"])
            self._sound(step, metrics)
        timer.seconds["timing_s/step"] = time.perf_counter() - start
        metrics |= self._data_metrics(batch) | timer.seconds | self._throughput(batch, timer.seconds)
        self._watch_signal(step, batch, metrics)
        return batch, metrics

    def _old_logprobs(self, batch: Batch, metrics: dict[str, float], timer: PhaseTimer) -> Batch:
        """The actor's no-grad pass (phase `old_log_prob`); its entropy and the engine-trainer difference go
        to `metrics`, the per-sample difference to the mismatch watch."""
        with timer("old_log_prob"):
            batch = batch.union(self.workers.actor.call_batch(Actor.compute_logprobs, batch))
        if "entropy" in batch:  # verl logs the rollout's entropy from the old-log-prob pass
            metrics["actor/entropy"] = float(masked_mean(batch["entropy"], batch["response_mask"]))
        if ROUTING_MISMATCH in batch:  # MoE routing recorded by the engine (docs/moe_routing_replay.md)
            metrics["moe/routing_mismatch"] = mismatch_share(batch[ROUTING_MISMATCH], batch["response_mask"])
        if "rollout_logprobs" in batch:
            metrics |= logprob_diff_metrics(
                batch["rollout_logprobs"], batch["old_logprobs"], batch["response_mask"]
            )
            self.watch.check_logprobs(batch, self.weight_version, "recompute")
        return batch

    def _sound(self, step: int, metrics: dict[str, float]) -> None:
        """This step's mismatch findings, once: `alarm/mismatch` (1 tripped, 0 not), the log line and
        `on_alarm`; with `trainer.mismatch_alarm=stop` the run ends here with the message."""
        if self.watch.mode is AlarmMode.OFF:
            return
        alarm = self.watch.take(step)
        metrics["alarm/mismatch"] = float(alarm is not None)
        if alarm is None:
            return
        log.warning("%s", alarm.message())
        if self.on_alarm is not None:
            self.on_alarm(alarm)
        if self.watch.mode is AlarmMode.STOP:
            raise MismatchAlarmError(alarm.message() + " (trainer.mismatch_alarm=stop; warn or off go on)")

    def _watch_signal(self, step: int, batch: Batch, metrics: dict[str, float]) -> None:
        """Count the step in the no-signal streaks: `alarm/no_signal` (1 while the alarm stands), and the
        log line and `on_alarm` on the step it trips."""
        if not self.signal.enabled:
            return
        alarm = self.signal.observe(step, batch, metrics)
        metrics[NO_SIGNAL_METRIC] = float(self.signal.standing)
        if alarm is None:
            return
        log.warning("%s", alarm.message())
        if self.on_alarm is not None:
            self.on_alarm(alarm)

    def _ref_logprobs(self, batch: Batch) -> Batch:
        """`ref_logprobs` of the batch from wherever the reference policy lives."""
        if self.workers.plan.ref_logprobs is RefLogprobs.ACTOR:  # LoRA: the actor with adapters disabled
            return self.workers.actor.call_batch(Actor.compute_ref_logprobs, batch)
        assert self.workers.reference is not None
        return self.workers.reference.call_batch(Reference.compute_ref_logprobs, batch)

    def _pool_metrics(self, window: Interval, gen_waits: list[Interval]) -> dict[str, float]:
        """The pools' idle times and overlap over the step's `window`: the rollout replicas report their
        busy spans; the trainer is busy whenever it was not waiting for generation."""
        rollout_busy: list[Interval] = []
        for spans in self.rollout.call(Rollout.busy_intervals, window[0]):  # a replica restarted since
            rollout_busy.extend(spans)  # has lost its spans
        return pool_metrics(busy_outside(gen_waits, window), rollout_busy, window)

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
        if "teacher_logprobs" in batch:
            advantages, returns = self._distill(batch, advantages, returns, metrics)
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

    def _distill(
        self, batch: Batch, advantages: torch.Tensor, returns: torch.Tensor, metrics: dict[str, float]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """On-policy distillation (`quartet.core.distill`): the teacher's per-token reverse-KL advantage
        x `distill_coef` added to the task's advantages x `distill_task_coef`; its metrics either way. The
        student's log-probs are the old policy's (the actor's pass, else the rollout's own)."""
        alg, mask = self.cfg.algorithm, batch["response_mask"]
        student = batch["old_logprobs"] if "old_logprobs" in batch else batch["rollout_logprobs"]
        teacher = batch["teacher_logprobs"]
        metrics |= distill_metrics(student, teacher, mask, batch.get("teacher_agrees", None))
        if alg.distill_coef == 0.0:
            return advantages, returns
        signal = reverse_kl_advantages(student, teacher, mask, alg.distill_gamma).to(advantages.dtype)
        metrics["distill/advantage/abs_mean"] = float(masked_mean(signal.abs(), mask))
        mixed = alg.distill_task_coef * advantages + alg.distill_coef * signal
        critic_free = self.workers.critic is None
        return mixed, (mixed if critic_free else returns)  # outcome estimators return their advantages

    def _data_metrics(self, batch: Batch) -> dict[str, float]:
        prompt_width = batch["prompts"].shape[1]
        sources = batch.non_tensors.get("data_source")
        per_source = (
            {} if sources is None
            else source_score_metrics(batch["token_level_scores"], batch["response_mask"], list(sources))
        )  # fmt: skip
        return per_source | batch_data_metrics(
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
