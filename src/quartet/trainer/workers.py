"""The role groups of an RL run, started on one colocated pool (or more, by config).

Every role lives in the same host process per bundle (one Ray actor per device slot): the actor, the
rollout engine next to it (weights synced in-process), and when the algorithm needs them the reference
policy (for KL; with LoRA the actor itself serves it with adapters disabled), the critic (GAE) and the
reward model. `cluster.separate_pools` moves the reference, critic or reward model onto a pool of its own
(its own host processes, label = the role's name). The driver calls the groups; `shutdown()` ends them all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from quartet.cluster.colocate import HostSet, RoleSpec
from quartet.cluster.group import RoleGroup
from quartet.cluster.host import Sibling
from quartet.cluster.naming import RunNames
from quartet.cluster.runtime import launch
from quartet.config import QuartetConfig
from quartet.roles.actor import Actor
from quartet.roles.critic import Critic
from quartet.roles.reference import Reference
from quartet.roles.reward_model import RewardModel
from quartet.roles.rollout import Rollout

__all__ = ["Workers", "start_workers"]

log = logging.getLogger(__name__)


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
    ref_in_actor: bool
    """With LoRA the actor computes the reference log-probs itself (adapters disabled)."""
    separate: dict[str, HostSet] = field(default_factory=dict)
    """Hosts of the roles on a pool of their own, by role."""

    def shutdown(self) -> None:
        try:
            self.rollout.shutdown()
        except Exception:  # the hosts are going away anyway; their shutdown below reports real failures
            log.debug("rollout engine shutdown failed", exc_info=True)
        errors: list[BaseException] = []
        for hosts in [self.hosts, *self.separate.values()]:
            try:
                hosts.shutdown()
            except Exception as exc:  # shut the others down before reporting
                errors.append(exc)
        if errors:
            raise errors[0]

    def ref_logprobs(self, batch: Any) -> Any:
        """`ref_logprobs` of the batch from wherever the reference policy lives."""
        if self.ref_in_actor:
            return self.actor.compute_ref_logprobs(batch)
        assert self.reference is not None
        return self.reference.compute_ref_logprobs(batch)


def start_workers(cfg: QuartetConfig, model_path: str, names: RunNames, total_steps: int) -> Workers:
    """Start every role the config needs on one colocated pool (actor first: the rollout syncs from it)."""
    lora = cfg.model.lora.rank > 0
    roles: dict[str, RoleSpec] = {
        "actor": RoleSpec(Actor, cfg, model_path, total_steps),
        "rollout": RoleSpec(Rollout, cfg, model_path, trainer=Sibling("actor")),
    }
    if cfg.needs_reference and not lora:
        roles["reference"] = RoleSpec(Reference, cfg, model_path)
    if cfg.needs_critic:
        roles["critic"] = RoleSpec(Critic, cfg, model_path, total_steps)
    if cfg.reward.model_path:
        roles["reward_model"] = RoleSpec(RewardModel, cfg, model_path)
    separate: dict[str, HostSet] = {}
    try:
        for role in cfg.cluster.separate_pools:
            if role in roles:
                separate[role] = launch(cfg.cluster, names, role, **{role: roles.pop(role)})
        hosts = launch(cfg.cluster, names, "rl", **roles)
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
        actor=groups["actor"],
        rollout=groups["rollout"],
        reference=groups.get("reference"),
        critic=groups.get("critic"),
        reward_model=groups.get("reward_model"),
        ref_in_actor=cfg.needs_reference and lora,
    )
