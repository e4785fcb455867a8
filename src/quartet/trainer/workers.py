"""The role groups of an RL run, started on one colocated pool (or more, by config).

Every role lives in the same host process per bundle (one Ray actor per device slot): the actor, the
rollout engine next to it (weights synced in-process), and when the algorithm needs them the reference
policy (for KL; with LoRA the actor itself serves it with adapters disabled), the critic (GAE) and the
reward model. `cluster.separate_pools` moves the rollout, reference, critic or reward model onto a pool of
its own (its own host processes, label = the role's name). A rollout on its own pool is disaggregated: its
hosts are threaded (a replica receives weights while it generates) and it gets the actor's weights over a
weight-sync group opened once at start (`quartet.roles.weight_stream`), each sync numbered by a version.
The driver calls the groups; `sync_weights(version)` brings the rollout up to the actor either way;
`shutdown()` ends them all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from quartet.cluster.colocate import HostSet, RoleSpec
from quartet.cluster.errors import WorkerError
from quartet.cluster.group import Pending, RoleGroup
from quartet.cluster.host import Sibling
from quartet.cluster.hostset import add_sentinel, remove_sentinel
from quartet.cluster.naming import RunNames
from quartet.cluster.runtime import launch
from quartet.config import QuartetConfig
from quartet.config.plan import RefLogprobs, StepPlan
from quartet.config.rollout import WeightApply
from quartet.core.batch import Batch
from quartet.roles.actor import Actor
from quartet.roles.critic import Critic
from quartet.roles.reference import Reference
from quartet.roles.reward_model import RewardModel
from quartet.roles.rollout import Rollout
from quartet.roles.run_values import RunValues
from quartet.trainer.overlap import pool_metrics

__all__ = ["Workers", "mean_over_ranks", "role_specs", "run_values", "start_workers"]

log = logging.getLogger(__name__)

_ENGINE_SHUTDOWN_S = 10.0
"""Longest wait for the rollout engines to stop cleanly before their host processes are killed."""

_RECEIVE_GRACE_S = 10.0
"""How much longer than the sync timeout the driver waits for replicas once the actor has sent everything."""

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
    separate: dict[str, HostSet] = field(default_factory=dict)
    """Hosts of the roles on a pool of their own, by role."""
    sync_timeout_s: float = 300.0
    """`rollout.weight_sync.timeout_s` of a separate rollout pool: the bound on one sync."""

    def start_timing(self) -> dict[str, float]:
        """Seconds of each pool's start phases: `connect`, `pool`, `hosts`, `role/<name>` (separate pools'
        prefixed by their role)."""
        out = dict(self.hosts.timing)
        for role, hosts in self.separate.items():
            out |= {f"{role}_pool/{k}": v for k, v in hosts.timing.items()}
        return out

    @property
    def rollout_separate(self) -> bool:
        """The rollout lives on a pool of its own (weights travel over the weight-sync group)."""
        return "rollout" in self.separate

    def open_weight_stream(self, bucket_bytes: int, timeout_s: float) -> None:
        """Form the weight-sync group: actor rank 0 listens, every rollout replica joins (bounded waits)."""
        self.sync_timeout_s = timeout_s
        receivers = self.rollout.world_size
        opened = self.actor.call(Actor.open_weight_stream, receivers, bucket_bytes, timeout_s)[0]
        assert opened is not None, "actor rank 0 opens the weight stream"
        host, port = opened
        joins = self.rollout.submit(Rollout.join_weight_stream, host, port, receivers + 1, timeout_s)
        self.actor.call(Actor.accept_weight_stream)
        joins.get(timeout_s + 30.0)
        log.info("weight stream open: actor rank 0 at %s:%d -> %d rollout replica(s)", host, port, receivers)

    def sync_weights(self, version: int, apply: WeightApply | None = None) -> dict[str, float]:
        """Bring every rollout replica to the actor's current weights, numbered `version`; the metrics.

        `apply` overrides `rollout.weight_sync.apply` for this sync (one_step_off applies after draining).
        """
        if not self.rollout_separate:
            synced = mean_over_ranks(self.rollout.call(Rollout.sync_weights, version))
            return {k: v for k, v in synced.items() if "timing" not in k}
        sent = self.actor.submit(Actor.publish_weights, version)
        received = self.rollout.submit(Rollout.receive_weights, apply)
        add_sentinel(received.raise_if_failed)  # a replica that dies mid-sync is named at once
        try:  # the actor's sync is bounded by the timeout, its gather included
            published = sent.get(self.sync_timeout_s + _RECEIVE_GRACE_S)
        except WorkerError as err:
            if "WeightSyncError" not in err.cause:
                raise  # the actor itself failed (died, ran out of memory): its own error says so
            rank, node = self._lagging(received)
            raise WorkerError(
                "rollout",
                rank,
                node,
                f"weight sync of version {version} failed on the actor's side: {err.cause}",
            ) from err
        finally:
            remove_sentinel(received.raise_if_failed)
        sent_metrics = mean_over_ranks(published)
        try:  # the actor finished sending: a replica has this long to finish taking it in
            got = received.get(self.sync_timeout_s + _RECEIVE_GRACE_S)
        except WorkerError as err:
            moved = int(sent_metrics.get("weight_sync/bytes", 0))
            raise WorkerError(
                "rollout",
                err.rank,
                err.node,
                f"weight sync of version {version}: the actor sent all {moved} bytes, but this replica did "
                f"not finish receiving and applying them: {err.cause}",
            ) from err
        return sent_metrics | mean_over_ranks(got)

    def _lagging(self, received: Pending[list[dict[str, float]]]) -> tuple[int, str]:
        """The first rollout replica whose receive has not finished (rank 0 when all did) and its node."""
        import ray

        done, _ = ray.wait(received.refs, num_returns=len(received.refs), timeout=0, fetch_local=False)
        lagging = [rank for rank, ref in enumerate(received.refs) if ref not in done]
        rank = lagging[0] if lagging else 0
        return rank, self.separate["rollout"].node_of(rank)

    def pool_metrics(
        self, window: tuple[float, float], trainer_waits: list[tuple[float, float]]
    ) -> dict[str, float]:
        """Idle times of the training and rollout pools over the step's wall-clock `window` and the share
        of it when both worked (`quartet.trainer.overlap`); the trainer is busy outside `trainer_waits`."""
        busy: list[tuple[float, float]] = []
        for spans in self.rollout.call(Rollout.busy_intervals, window[0]):
            busy.extend(spans)
        trainer_busy, cursor = [], window[0]
        for began, ended in sorted(trainer_waits):
            trainer_busy.append((cursor, began))
            cursor = max(cursor, ended)
        trainer_busy.append((cursor, window[1]))
        return pool_metrics(trainer_busy, busy, window)

    def shutdown(self) -> None:
        try:  # bounded: a wedged replica must not hold the run's end (its process is killed below)
            self.rollout.submit(Rollout.shutdown).get(_ENGINE_SHUTDOWN_S)
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

    def ref_logprobs(self, batch: Batch) -> Batch:
        """`ref_logprobs` of the batch from wherever the reference policy lives."""
        if self.plan.ref_logprobs is RefLogprobs.ACTOR:  # LoRA: the actor with adapters disabled
            return self.actor.call_batch(Actor.compute_ref_logprobs, batch)
        assert self.reference is not None
        return self.reference.call_batch(Reference.compute_ref_logprobs, batch)


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
        custom_module=cfg.algorithm.custom_module,
    )


def role_specs(cfg: QuartetConfig, plan: StepPlan, run: RunValues) -> dict[str, RoleSpec]:
    """Each role of `plan` with its own config section and the run-wide values (actor first)."""
    precision = cfg.actor.mixed_precision  # the policy's numerics, for the roles that score its samples
    sibling = None if "rollout" in cfg.cluster.separate_pools else Sibling("actor")  # else weight stream
    roles: dict[str, RoleSpec] = {
        "actor": RoleSpec(Actor, cfg.actor, run, lora=cfg.model.lora, ref_logprobs=cfg.reference.logprobs),
        "rollout": RoleSpec(Rollout, cfg.rollout, run, trainer=sibling),
    }
    if plan.ref_logprobs is RefLogprobs.REFERENCE:
        roles["reference"] = RoleSpec(Reference, cfg.reference, run, precision)
    if plan.critic:
        roles["critic"] = RoleSpec(Critic, cfg.critic, run)
    if plan.reward_model:
        roles["reward_model"] = RoleSpec(RewardModel, cfg.reward, run, precision)
    return roles


def start_workers(
    cfg: QuartetConfig, plan: StepPlan, model_path: str, names: RunNames, total_steps: int
) -> Workers:
    """Start the roles of `plan` on one colocated pool (actor first: the rollout syncs from it)."""
    roles = role_specs(cfg, plan, run_values(cfg, model_path, total_steps))
    separate: dict[str, HostSet] = {}
    try:
        for role in cfg.cluster.separate_pools:
            if role in roles:
                calls = cfg.trainer.async_buffer + _ROLLOUT_SIDE_CALLS if role == "rollout" else 1
                own = {role: roles.pop(role)}
                separate[role] = launch(cfg.cluster, names, role, calls, **own)
        hosts = launch(cfg.cluster, names, "rl", 1, **roles)
    except BaseException:
        for started in separate.values():
            started.shutdown()
        raise
    groups = dict(hosts.groups)
    for role, role_hosts in separate.items():
        groups[role] = role_hosts.groups[role]
    workers = Workers(
        separate=separate,
        hosts=hosts,
        actor=groups["actor"],
        rollout=groups["rollout"],
        reference=groups.get("reference"),
        critic=groups.get("critic"),
        reward_model=groups.get("reward_model"),
        plan=plan,
    )
    if workers.rollout_separate:
        try:
            sync = cfg.rollout.weight_sync
            workers.open_weight_stream(sync.bucket_bytes, sync.timeout_s)
        except BaseException:
            workers.shutdown()
            raise
    return workers
