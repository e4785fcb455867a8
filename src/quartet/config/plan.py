"""The step plan: what one RL step does, decided once from the whole config before any worker starts.

    plan = plan_step(cfg)                  # frozen; the driver's step and start_workers read it
    plan.roles                             # ('actor', 'rollout', 'reference', ...): the roles to start
    plan.old_logprobs                      # OldLogprobs.ACTOR_PASS or OldLogprobs.UPDATE
    plan.generation_ahead                  # the rollout generates ahead while the actor trains

Every rule that combines sections to decide a phase lives here and nowhere else (the config sections hold
settings, not decisions), so the driver reads "does this phase run" from one object that a unit test checks
against a truth table. What `trainer.mode` implies (whether generation overlaps training, how many batches
are buffered ahead, how staleness is kept, when a replica applies new weights) is decided here too: no
module outside `config/` branches on the mode. It sits in `config/` (not `trainer/`) because the memory
planner, which the trainer imports, needs the same decisions.

"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from quartet.config.roles import Role, RoutingReplay
from quartet.config.rollout import WeightApply
from quartet.config.root import QuartetConfig
from quartet.config.trainer import StalenessControl, TrainerMode
from quartet.core.choices import AdvantageEstimator

__all__ = ["OldLogprobs", "RefLogprobs", "StepPlan", "plan_step"]


class OldLogprobs(StrEnum):
    """Where the PPO ratio's old (behaviour-at-update-start) log-probs come from."""

    ACTOR_PASS = "actor_pass"
    """A no-grad pass of the actor before the update (phase `old_log_prob`)."""
    UPDATE = "update"
    """The update's own forward: one optimizer step over the whole batch, whose policy before the step is
    the old one, so a separate pass would recompute the same numbers (`actor.reuse_update_logprobs`)."""


class RefLogprobs(StrEnum):
    """Where the reference policy's log-probs (for a KL term) come from."""

    NONE = "none"
    """No KL term uses them: no phase `ref`, no reference role."""
    REFERENCE = "reference"
    """The `reference` role: a frozen copy of the initial policy."""
    ACTOR = "actor"
    """The actor with its LoRA adapters disabled (the base model is the initial policy)."""


@dataclass(frozen=True)
class StepPlan:
    """Which phases of the step run and which roles exist (see `plan_step` for the rules)."""

    old_logprobs: OldLogprobs
    ref_logprobs: RefLogprobs
    critic: bool
    """A critic role: phases `values` and `update_critic` (estimators that bootstrap from values: GAE)."""
    reward_model: bool
    """A reward-model role scores responses before the rule scorers (`reward.model_path`)."""
    kl_in_reward: bool
    """The in-reward KL penalty shapes `token_level_rewards` (`algorithm.use_kl_in_reward`)."""
    kl_loss: bool
    """The actor's loss has a KL term (`actor.use_kl_loss`)."""
    dynamic_sampling: bool
    """DAPO's dynamic sampling draws more prompts until enough groups are informative."""
    greedy_baseline: bool
    """One greedy response per prompt is generated and scored as the baseline (ReMax)."""
    sleep_rollout: bool
    """The rollout engine frees its KV cache after generation (`rollout.sleep_while_training`)."""
    critic_warmup: int
    """Steps that update only the critic; the actor update and weight sync start after them."""
    generation_ahead: bool
    """The rollout generates the next batches on its own pool while the actor trains on this one
    (`trainer.mode=one_step_off|async`): the batch source is the feed, and a batch's tokens may come from
    weights older than the trainer's (so the engine-trainer checks count only rows of the trainer's
    version). False: each step's batch is generated when the step asks, by the current weights."""
    batches_ahead: int
    """How many batches the feed keeps generating ahead of the one the trainer takes: 0 in sync mode, 1 for
    one_step_off, `trainer.async_buffer` for async."""
    tunable_depth: bool
    """`trainer.async_buffer` sets `batches_ahead` (async), so advice may propose another depth;
    one_step_off is one batch ahead by construction."""
    max_staleness: int | None
    """The staleness bound the feed keeps (async: `trainer.max_staleness`); None: nothing to keep (sync is
    on-policy, one_step_off's staleness is 1 by construction)."""
    admission: bool
    """The bound is kept by admission control, not by dropping stale groups (async with
    `trainer.staleness_control=admission`)."""
    weight_apply: WeightApply | None
    """When a replica applies new weights, for every sync: one_step_off applies after the replica drained the
    batch it generates (so that batch keeps the weights it started with); None: as
    `rollout.weight_sync.apply` says."""
    record_routing: bool = False
    """The rollout engine records each token's MoE routing (`rollout.record_routing`, or implied by
    `actor.routing_replay=rollout`): the batch carries `routed_experts`."""
    routing_replay: bool = False
    """The policy's training passes (actor and reference) replay the recorded routing
    (`actor.routing_replay=rollout`)."""
    teacher: bool = False
    """A teacher role scores the sampled tokens (phase `teacher`; `teacher.model_path`): on-policy
    distillation's advantage when `algorithm.distill_coef` > 0, its metrics always."""

    @property
    def roles(self) -> tuple[Role, ...]:
        """The roles to start, actor first (the rollout engine syncs its weights from it)."""
        out = [Role.ACTOR, Role.ROLLOUT]
        if self.ref_logprobs is RefLogprobs.REFERENCE:
            out.append(Role.REFERENCE)
        if self.critic:
            out.append(Role.CRITIC)
        if self.reward_model:
            out.append(Role.REWARD_MODEL)
        if self.teacher:
            out.append(Role.TEACHER)
        return tuple(out)

    def updates_actor(self, step: int) -> bool:
        """Whether global step `step` (from 1) updates the actor and syncs the rollout engine's weights."""
        return step > self.critic_warmup


def plan_step(cfg: QuartetConfig) -> StepPlan:
    """The plan of every step of a run with `cfg` (valid or not: it never raises)."""
    alg, actor = cfg.algorithm, cfg.actor
    uses_ref = actor.use_kl_loss or alg.use_kl_in_reward
    lora = cfg.model.lora.rank > 0
    # The update may serve as its own old policy only with one optimizer step over the whole batch, and only
    # when nothing before the update needs old log-probs (the in-reward KL reads them) and the batch is the
    # one generated (dynamic sampling's filtered batch may hold groups of other draws).
    one_step = actor.epochs == 1 and actor.mini_batch_size == cfg.data.train_batch_size
    reuse = actor.reuse_update_logprobs and one_step and not alg.use_kl_in_reward and not alg.filter_groups
    t = cfg.trainer
    ahead = t.mode is not TrainerMode.SYNC  # one_step_off and async generate on the rollout's own pool
    is_async = t.mode is TrainerMode.ASYNC
    return StepPlan(
        old_logprobs=OldLogprobs.UPDATE if reuse else OldLogprobs.ACTOR_PASS,
        ref_logprobs=(
            RefLogprobs.NONE if not uses_ref else RefLogprobs.ACTOR if lora else RefLogprobs.REFERENCE
        ),
        critic=alg.needs_critic,
        reward_model=bool(cfg.reward.model_path),
        kl_in_reward=alg.use_kl_in_reward,
        kl_loss=actor.use_kl_loss,
        dynamic_sampling=alg.filter_groups,
        greedy_baseline=alg.adv_estimator is AdvantageEstimator.REMAX,
        sleep_rollout=cfg.rollout.sleep_while_training,
        critic_warmup=t.critic_warmup,
        generation_ahead=ahead,
        batches_ahead=t.async_buffer if is_async else int(ahead),
        tunable_depth=is_async,
        max_staleness=t.max_staleness if is_async else None,
        admission=is_async and t.staleness_control is StalenessControl.ADMISSION,
        weight_apply=WeightApply.AFTER_DRAIN if t.mode is TrainerMode.ONE_STEP_OFF else None,
        record_routing=cfg.rollout.record_routing or actor.routing_replay is RoutingReplay.ROLLOUT,
        routing_replay=actor.routing_replay is RoutingReplay.ROLLOUT,
        teacher=cfg.teacher.local,
    )
