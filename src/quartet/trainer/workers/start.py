"""The role groups of an RL run, started on one colocated pool (or more, by config).

Every role lives in the same host process per bundle (one Ray actor per device slot): the actor, the
rollout engine next to it (weights synced in-process), and when the algorithm needs them the reference
policy (for KL; with LoRA the actor itself serves it with adapters disabled), the critic (GAE) and the
reward model. `cluster.separate_pools` moves the rollout, reference, critic or reward model onto a pool of
its own (its own host processes, label = the role's name). A rollout on its own pool is disaggregated: its
hosts are threaded (a replica receives weights while it generates) and it gets the actor's weights over a
weight-sync group opened once at start (`quartet.roles.weight_stream`), each sync numbered by a version.
The driver calls the groups (`quartet.trainer.workers.weight_sync` brings the rollout up to the actor
either way); `shutdown()` ends them all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from quartet.cluster.colocate import HostSet, RoleSpec
from quartet.cluster.early_hosts import MAIN_LABEL
from quartet.cluster.group import RoleGroup
from quartet.cluster.host import Sibling
from quartet.cluster.naming import RunNames
from quartet.cluster.runtime import launch
from quartet.config import QuartetConfig, Role
from quartet.config.cluster import MAIN_POOL
from quartet.config.plan import RefLogprobs, StepPlan
from quartet.roles.actor import Actor
from quartet.roles.critic import Critic
from quartet.roles.reference import Reference
from quartet.roles.reward_model import RewardModel
from quartet.roles.rollout import Rollout
from quartet.roles.run_values import RunValues
from quartet.roles.teacher import Teacher

__all__ = ["Workers", "mean_over_ranks", "role_specs", "run_values", "start_workers"]

log = logging.getLogger(__name__)

_ENGINE_SHUTDOWN_S = 10.0
"""Longest wait for the rollout engines to stop cleanly before their host processes are killed."""

_ROLLOUT_SIDE_CALLS = 3
"""Calls a rollout host on its own pool runs beside the generations queued ahead (`trainer.async_buffer`,
which wait their turn in order): a weight receive, a busy-time query and a stale group's regeneration."""


def mean_over_ranks(outputs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The per-key mean of the metric dicts that the data-parallel ranks returned (one per rank)."""
    dicts = [d for d in outputs if d]
    keys = {k for d in dicts for k in d}
    return {k: sum(float(d[k]) for d in dicts if k in d) / sum(1 for d in dicts if k in d) for k in keys}


@dataclass
class Workers:
    """Handles of the run's role groups (None for roles the algorithm does not use)."""

    hosts: HostSet
    """The main pool's hosts (actor, rollout and every role not separated)."""
    actor: RoleGroup[Actor]
    rollout: RoleGroup[Rollout]
    reference: RoleGroup[Reference] | None
    critic: RoleGroup[Critic] | None
    reward_model: RoleGroup[RewardModel] | None
    plan: StepPlan
    """What every step does; the groups above are the roles it names."""
    separate: dict[Role, HostSet] = field(default_factory=dict)
    """Hosts of the roles on a pool of their own, by role."""
    teacher: RoleGroup[Teacher] | None = None
    """On-policy distillation's teacher (`teacher.model_path`)."""

    def start_timing(self) -> dict[str, float]:
        """Seconds of each pool's start phases: `connect`, `pool`, `hosts`, `role/<name>` (separate pools'
        prefixed by their role)."""
        out = dict(self.hosts.timing)
        for role, hosts in self.separate.items():
            out |= {f"{role}_pool/{k}": v for k, v in hosts.timing.items()}
        return out

    @property
    def host_sets(self) -> list[HostSet]:
        """Every pool's hosts: the main pool first, then the separate ones."""
        return [self.hosts, *self.separate.values()]

    @property
    def rollout_separate(self) -> bool:
        """The rollout lives on a pool of its own (weights travel over the weight-sync group)."""
        return Role.ROLLOUT in self.separate

    def shutdown(self) -> None:
        """Stop the rollout engines cleanly (bounded; not on a host that was already silent past a deadline,
        e.g. a stopped rank), then kill every pool's host processes."""
        if not self.separate.get(Role.ROLLOUT, self.hosts).silent:
            try:  # bounded: a wedged replica must not hold the run's end (its process is killed below)
                self.rollout.submit(Rollout.shutdown).get(_ENGINE_SHUTDOWN_S)
            except Exception:  # the hosts are going away anyway; their shutdown below reports real failures
                log.debug("rollout engine shutdown failed", exc_info=True)
        errors: list[BaseException] = []
        for hosts in self.host_sets:
            try:
                hosts.shutdown()
            except Exception as exc:  # shut the others down before reporting
                errors.append(exc)
        if errors:
            raise errors[0]


def run_values(cfg: QuartetConfig, model_path: str, total_steps: int = 0) -> RunValues:
    """The run-wide values the roles read beyond their own sections."""
    return RunValues(
        model_path=model_path,
        max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.data.max_response_length,
        prompts_per_step=cfg.data.train_batch_size,
        responses_per_prompt=cfg.rollout.n,
        seed=cfg.trainer.seed,
        trainer_steps=total_steps,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        remove_padding=cfg.model.remove_padding,
        shared_prompts=cfg.model.shared_prompts,
        sequence_parallel_size=cfg.model.sequence_parallel_size,
        tensor_parallel_size=cfg.model.tensor_parallel_size,
        expert_parallel_size=cfg.model.expert_parallel_size,
        fused_head=cfg.model.fused_head,
        freeze_vision_tower=cfg.model.freeze_vision_tower,
        gkd_coef=cfg.algorithm.gkd_coef,
        gkd_beta=cfg.algorithm.gkd_beta,
        gkd_top_k=cfg.algorithm.gkd_top_k,
        custom_module=cfg.algorithm.custom_module,
        image_pixels=(cfg.data.min_pixels, cfg.data.max_pixels),
    )


def role_specs(cfg: QuartetConfig, plan: StepPlan, run: RunValues) -> dict[Role, RoleSpec]:
    """Each role of `plan` with its own config section and the run-wide values (actor first)."""
    precision = cfg.actor.mixed_precision  # the policy's numerics, for the roles that score its samples
    separate_rollout = Role.ROLLOUT in cfg.cluster.separate_pools
    sibling = None if separate_rollout else Sibling(Role.ACTOR)  # else the weight stream
    actor = RoleSpec(Actor, cfg.actor, run, lora=cfg.model.lora, ref_logprobs=cfg.reference.logprobs)
    rollout = cfg.rollout
    if plan.record_routing and not rollout.record_routing:  # implied by actor.routing_replay=rollout
        rollout = replace(rollout, record_routing=True)
    roles = {Role.ACTOR: actor, Role.ROLLOUT: RoleSpec(Rollout, rollout, run, trainer=sibling)}
    if plan.ref_logprobs is RefLogprobs.REFERENCE:
        roles[Role.REFERENCE] = RoleSpec(Reference, cfg.reference, run, precision, plan.routing_replay)
    if plan.critic:
        roles[Role.CRITIC] = RoleSpec(Critic, cfg.critic, run)
    if plan.reward_model:
        roles[Role.REWARD_MODEL] = RoleSpec(RewardModel, cfg.reward, run, precision)
    if plan.teacher:
        roles[Role.TEACHER] = RoleSpec(Teacher, cfg.teacher, run, precision)
    return roles


def start_workers(
    cfg: QuartetConfig, plan: StepPlan, model_path: str, names: RunNames, total_steps: int
) -> Workers:
    """Start the roles of `plan` on one colocated pool, and those of `cluster.separate_pools` on their own
    (actor first: the rollout syncs from it). The weight stream to a separate rollout is opened after this
    (`quartet.trainer.workers.weight_sync.open_weight_sync`)."""
    roles = role_specs(cfg, plan, run_values(cfg, model_path, total_steps))
    separate: dict[Role, HostSet] = {}
    try:
        for role in cfg.cluster.separate_pools:
            if role in roles:
                calls = cfg.trainer.async_buffer + _ROLLOUT_SIDE_CALLS if role is Role.ROLLOUT else 1
                own = {role: roles.pop(role)}
                separate[role] = launch(cfg.cluster, names, role, calls, str(role), **own)
        hosts = launch(cfg.cluster, names, MAIN_LABEL, 1, MAIN_POOL, **roles)
    except BaseException:
        for started in separate.values():
            started.shutdown()
        raise
    groups = dict(hosts.groups)
    for role, role_hosts in separate.items():
        groups[role] = role_hosts.groups[role]
    return Workers(
        separate=separate,
        hosts=hosts,
        actor=groups[Role.ACTOR],
        rollout=groups[Role.ROLLOUT],
        reference=groups.get(Role.REFERENCE),
        critic=groups.get(Role.CRITIC),
        reward_model=groups.get(Role.REWARD_MODEL),
        teacher=groups.get(Role.TEACHER),
        plan=plan,
    )
