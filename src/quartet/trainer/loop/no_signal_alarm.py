"""The no-signal alarm: say that the run learns nothing because no step gives the policy a signal.

A model that never gets a reward (a random or base model on a task it cannot do yet), a reward function that
returns a constant or cannot parse the model's answers, or `rollout.n=1` with a group estimator: every
prompt group's rewards are equal, every advantage is 0, the actor's gradient is 0, and the run goes on for
its whole length with every figure at 0 and no word. The step already has the figures (the batch's
`token_level_scores`, `advantages`, `uid`; the actor's `actor/grad_norm`); this module turns them into an
alarm (`trainer.no_signal_steps`):

    watch = NoSignalWatch.from_config(cfg)
    alarm = watch.observe(step, batch, metrics)   # after the actor update; an alarm on the step it trips
    metrics["alarm/no_signal"] = float(watch.standing)

Two streaks are counted, each over consecutive steps:
- `rewards`: steps without a reward signal: every prompt group's rewards are equal (group estimators; the
  groups DAPO's `algorithm.filter_groups` would drop), or the whole batch's rewards are equal (any
  estimator), or every response token's advantage is 0 (|A| < `ZERO_ADVANTAGE`). Some equal groups among
  others are normal: the step has a signal (with `filter_groups` the batch is all equal groups only when
  every draw was, and padded). Equal rewards count even when the KL penalty in the reward makes the
  advantages nonzero (it teaches no task); with turn rewards in play (`algorithm.turn_reward_coef`) they do
  not: only zero advantages do;
- `gradients`: actor updates whose `actor/grad_norm` is 0 (below `ZERO_GRAD_NORM`); a step without an
  actor update (`trainer.critic_warmup`) neither counts nor breaks it.

When a streak reaches `trainer.no_signal_steps` the alarm trips: one warning that says what was seen, for
how many steps, the likely causes and the fix, and one `alarm` record. It then stands (`alarm/no_signal`
1) and says nothing more while the signal stays away; when the signal comes back (no streak at the length
any more) it stands down, and a new streak of the same length trips it again: a run that flickers says so
at most once per `no_signal_steps + 1` steps. A resumed run counts afresh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from quartet.config import QuartetConfig
from quartet.core.batch import Batch
from quartet.core.reward_shaping import dynamic_sampling_filter

__all__ = [
    "NO_SIGNAL_METRIC",
    "ZERO_ADVANTAGE",
    "ZERO_GRAD_NORM",
    "NoSignalAlarm",
    "NoSignalWatch",
    "StepSignal",
    "step_signal",
]

NO_SIGNAL_METRIC = "alarm/no_signal"
"""The step metric: 1 while the alarm stands, 0 otherwise (absent with `trainer.no_signal_steps=0`)."""
ZERO_ADVANTAGE = 1e-8
"""An advantage below this in size is 0: GRPO's group-relative advantage of equal rewards is exactly 0."""
ZERO_GRAD_NORM = 1e-10
"""A gradient norm below this is 0: a policy loss whose every advantage is 0 has exactly 0 gradient."""
EQUAL_REWARDS = 1e-8
"""Rewards closer than this are equal (the tolerance of "max - min" within a group or the batch)."""


@dataclass(frozen=True)
class StepSignal:
    """What one step's batch says of the reward signal."""

    responses: int
    mean_reward: float
    """Mean sequence reward (`token_level_scores` summed over the response) of the batch."""
    batch_equal: bool
    """Every response of the batch got the same reward."""
    groups: int
    """Prompt groups (`uid`) of the batch."""
    equal_groups: int | None
    """Groups whose responses all got the same reward (a group of one counts); None: not a group estimator."""
    max_abs_advantage: float
    turn_rewards: bool = False
    """Turn rewards add to the advantages (`algorithm.turn_reward_coef`): equal outcome rewards prove none."""

    @property
    def zero_advantages(self) -> bool:
        return self.max_abs_advantage < ZERO_ADVANTAGE

    @property
    def equal_rewards(self) -> bool:
        """The rewards prefer no response of a group (group estimators) or of the batch over another."""
        if self.turn_rewards:
            return False
        return self.batch_equal or (self.equal_groups is not None and self.equal_groups == self.groups)

    @property
    def silent(self) -> bool:
        return self.equal_rewards or self.zero_advantages

    def describe(self) -> str:
        """What was seen, e.g. `all 32 groups had equal rewards (mean reward 0.000)`."""
        reward = f"mean reward {self.mean_reward:.3f}"
        if self.equal_rewards and self.equal_groups is not None:
            seen = f"all {self.groups} groups had equal rewards ({reward})"
        elif self.equal_rewards:
            seen = f"all {self.responses} responses had the same reward ({reward})"
        else:
            seen = f"every advantage was 0 ({reward}, max |advantage| {self.max_abs_advantage:.3g})"
        if self.zero_advantages:
            return seen + ": every advantage is 0, nothing is learned"
        return seen + ": the reward prefers no response over another, only the KL penalty moves the policy"


def step_signal(batch: Batch, needs_group: bool, turn_rewards: bool = False) -> StepSignal:
    """The reward signal of a step's batch after its advantages (`token_level_scores`, `response_mask`,
    `advantages`, `uid`); `needs_group`: the estimator compares the responses of one prompt."""
    mask = batch["response_mask"].bool()
    scores = (batch["token_level_scores"].double() * mask).sum(-1)
    advantages = batch["advantages"].double().abs() * mask
    uid = batch.non_tensors["uid"]
    groups = dynamic_sampling_filter(scores, uid, atol=EQUAL_REWARDS, keep_singletons=False)
    n_groups = groups.kept_groups + groups.dropped_groups
    spread = float(scores.max() - scores.min()) if len(scores) else 0.0
    return StepSignal(
        responses=len(scores),
        mean_reward=float(scores.mean()) if len(scores) else 0.0,
        batch_equal=spread <= EQUAL_REWARDS,
        groups=n_groups,
        equal_groups=groups.dropped_groups if needs_group else None,
        max_abs_advantage=float(advantages.max()) if advantages.numel() else 0.0,
        turn_rewards=turn_rewards,
    )


@dataclass(frozen=True)
class NoSignalAlarm:
    """A tripped no-signal alarm: what tripped, for how many steps, and why it may be."""

    step: int
    steps: int
    """Consecutive steps without a signal (`trainer.no_signal_steps`)."""
    phases: tuple[str, ...]
    """`rewards`, `gradients` or both: which streaks reached the length."""
    seen: str
    causes: tuple[str, ...]

    def message(self) -> str:
        return (
            f"no-signal alarm at step {self.step}: for {self.steps} steps {self.seen}. Likely causes, "
            f"with their fix: " + "; ".join(self.causes) + " (trainer.no_signal_steps=0 turns this check off)"
        )

    def record(self) -> dict[str, Any]:
        """The `alarm` record of the run's trackers (as the mismatch alarm's; `quartet inspect` lists it)."""
        return {
            "step": self.step,
            "alarm": "no_signal",
            "phase": ",".join(self.phases),
            "alarm/no_signal_steps": self.steps,
            "message": self.message(),
        }


_NEVER_REWARDED = (
    "a model that never gets a reward (a random or base model on a task it cannot do yet): start from an "
    "SFT'd model, e.g. trainer.sft_warm_start=true with an `sft:` section, or model.path=DIR of a fine-tuned "
    "model"
)
_FORMAT = (
    "an answer format the reward does not parse: read the responses (trainer.rollout_freq=1, `quartet "
    "inspect`) against the format the reward expects, and fix the prompt or the parser"
)
_ALIKE = (
    "the responses to one prompt are all alike (a low rollout.temperature, or a collapsed policy): raise "
    "rollout.temperature, or rollout.n"
)
_GRADIENTS = (
    "no response token reaches the loss (empty or fully masked responses): check data.max_response_length "
    "and the response masks in the rollout records",
    "no trainable parameter reaches the loss (e.g. LoRA target modules that match no layer)",
)


def _causes(cfg: QuartetConfig, signal: StepSignal | None, phases: tuple[str, ...]) -> tuple[str, ...]:
    """The likely causes, the most likely first, each with its fix."""
    alg = cfg.algorithm
    causes = []
    if alg.needs_group and cfg.rollout.n == 1:
        causes.append(
            f"rollout.n=1 with the group estimator {alg.adv_estimator}: each group holds one response and "
            "nothing to compare it with; set rollout.n >= 2 (e.g. 4..16)"
        )
    if "rewards" in phases and signal is not None:
        constant = (
            f"a reward function that returns a constant (every response of the step scored "
            f"{signal.mean_reward:.3f}): check reward.function / reward_funcs on a few responses by hand"
        )
        if not signal.batch_equal:
            causes += [_ALIKE, _NEVER_REWARDED, _FORMAT]
        elif abs(signal.mean_reward) < EQUAL_REWARDS:
            causes += [_NEVER_REWARDED, constant, _FORMAT]
        else:
            easy = "prompts too easy for the model (every response gets the same reward): harder data"
            causes += [constant, easy, _FORMAT]
    if phases == ("gradients",):  # with zero advantages a zero gradient needs no other cause
        causes += _GRADIENTS
    return tuple(causes)


@dataclass
class NoSignalWatch:
    """The two streaks of the module docstring, fed once per step by `observe`."""

    cfg: QuartetConfig
    steps: int
    """`trainer.no_signal_steps`: the streak length that trips the alarm; 0 turns the watch off."""
    reward_streak: int = 0
    grad_streak: int = 0
    spoken: bool = False
    """The alarm has tripped and the signal has not come back since: it stays quiet."""
    last: StepSignal | None = None

    @classmethod
    def from_config(cls, cfg: QuartetConfig) -> NoSignalWatch:
        return cls(cfg, cfg.trainer.no_signal_steps)

    @property
    def enabled(self) -> bool:
        return self.steps > 0

    @property
    def standing(self) -> bool:
        """A streak has reached `steps`: the step metric `alarm/no_signal` is 1."""
        return self.enabled and max(self.reward_streak, self.grad_streak) >= self.steps

    def observe(self, step: int, batch: Batch, metrics: dict[str, float]) -> NoSignalAlarm | None:
        """Count step `step` (its batch after the advantages, its metrics after the actor update); the alarm
        on the step a streak trips it, once until the signal comes back, else None."""
        if not self.enabled:
            return None
        alg = self.cfg.algorithm
        turn_rewards = alg.turn_reward_coef > 0 and "turn_rewards" in batch
        signal = step_signal(batch, alg.needs_group, turn_rewards)
        return self.update(step, signal, metrics.get("actor/grad_norm"))

    def update(self, step: int, signal: StepSignal, grad_norm: float | None) -> NoSignalAlarm | None:
        """`observe` from the step's figures: its `step_signal` and the actor's grad norm (None: no actor
        update this step, which neither counts nor breaks the gradient streak; nor does a non-finite one,
        a skipped update)."""
        if not self.enabled:
            return None
        self.last = signal
        self.reward_streak = self.reward_streak + 1 if signal.silent else 0
        if grad_norm is not None and math.isfinite(grad_norm):
            self.grad_streak = self.grad_streak + 1 if abs(grad_norm) < ZERO_GRAD_NORM else 0
        return self._sound(step)

    def _sound(self, step: int) -> NoSignalAlarm | None:
        if not self.standing:
            self.spoken = False  # the signal came back (or never left): the next streak may speak
            return None
        if self.spoken:
            return None
        self.spoken = True
        phases = tuple(
            name
            for name, streak in (("rewards", self.reward_streak), ("gradients", self.grad_streak))
            if streak >= self.steps
        )
        if "rewards" not in phases or self.last is None:
            seen = "the actor's gradient norm (actor/grad_norm) was 0: no update changes the policy"
        else:
            seen = self.last.describe() + ("; actor/grad_norm was 0 too" if "gradients" in phases else "")
        return NoSignalAlarm(step, self.steps, phases, seen, _causes(self.cfg, self.last, phases))
