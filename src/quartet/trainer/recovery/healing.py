"""The rollout group that heals itself, and the weight sync that restarts what died under it.

    rollout, weights = heal_rollout(cfg, workers, weights)   # after open_weight_sync
    batch = rollout.call_batch(Rollout.generate, prompts)    # a replica that dies meanwhile is restarted
    metrics |= rollout.step_metrics()                        # async/replica_restarts, ...

With recovery on (the rollout on a pool of its own, `rollout.max_replica_restarts` > 0), the batch sources,
the step and validation get a `HealingRollout`: the same calls as the plain view
(`quartet.trainer.workers.rollout_calls`), each one restarting a replica that dies under it through the run's
`ReplicaKeeper` and sending the dead replica's share again; the weight sync they get is a `RecoveringSync`
whose every sync goes through the keeper. Without recovery they get the plain group and weight sync, and a
dead replica ends the run. Either way the loop holds no keeper and no recovery branch.

Calls submitted and not yet collected (the generations queued ahead by the async feed) are sent again to
a restarted replica as soon as it has the current weights, oldest first, so nothing queued is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from quartet.cluster.group import Pending
from quartet.cluster.run_record import record_hosts
from quartet.config import QuartetConfig, Role
from quartet.config.rollout import WeightApply
from quartet.core.batch import Batch
from quartet.roles.rollout import Rollout
from quartet.trainer.recovery.replica_keeper import ReplicaKeeper
from quartet.trainer.workers.rollout_calls import InFlight, RolloutCalls
from quartet.trainer.workers.start import Workers
from quartet.trainer.workers.weight_sync import StreamSync, WeightSync

__all__ = ["HealingCall", "HealingRollout", "RecoveringSync", "heal_rollout"]

P = ParamSpec("P")
R = TypeVar("R")
J = TypeVar("J")


class HealingCall(Generic[J]):
    """A call in flight whose `get` restarts a replica that died under it and sends its share again."""

    def __init__(self, pending: Pending[J], keeper: ReplicaKeeper, in_flight: list[HealingCall[Any]]) -> None:
        self.pending = pending
        self.keeper = keeper
        self.in_flight = in_flight
        """The view's calls not yet collected: this one until its `get` starts."""

    def get(self) -> J:
        """The result, healed (at the weights every replica holds now)."""
        if self in self.in_flight:  # collected now: healed here, after the calls queued behind it
            self.in_flight.remove(self)
        return self.keeper.resolve(self.pending, self.keeper.version)

    def raise_if_failed(self) -> None:
        """For a sentinel: a replica death the keeper will heal is only noted; any other failure raises."""
        if not self.keeper.tolerates(self.pending):
            self.pending.raise_if_failed()


class HealingRollout(RolloutCalls):
    """The rollout group's calls, each healed by `keeper` (see the module docstring)."""

    def __init__(self, keeper: ReplicaKeeper, group_calls: RolloutCalls) -> None:
        super().__init__(group_calls.group)
        self.keeper = keeper
        self.in_flight: list[HealingCall[Any]] = []
        keeper.on_restart.append(self._send_again)

    def call(self, fn: Callable[Concatenate[Rollout, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        return self.submit(fn, *args, **kwargs).get()

    def submit(
        self, fn: Callable[Concatenate[Rollout, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> InFlight[list[R]]:
        return self._healing(self.group.submit(fn, *args, **kwargs))

    def call_batch(
        self, fn: Callable[Concatenate[Rollout, P], Batch], *args: P.args, **kwargs: P.kwargs
    ) -> Batch:
        return self.submit_batch(fn, *args, **kwargs).get()

    def submit_batch(
        self, fn: Callable[Concatenate[Rollout, P], Batch], *args: P.args, **kwargs: P.kwargs
    ) -> InFlight[Batch]:
        return self._healing(self.group.submit_batch(fn, *args, **kwargs))

    def step_metrics(self) -> dict[str, float]:
        """The step's `async/replica_restarts`, `async/replica_restarts_total`,
        `async/regenerated_after_failure`, `async/replica_restart_s`."""
        return self.keeper.step_metrics()

    def _healing(self, pending: Pending[J]) -> HealingCall[J]:
        call = HealingCall(pending, self.keeper, self.in_flight)
        self.in_flight.append(call)
        return call

    def _send_again(self, ranks: list[int]) -> None:
        """Replicas `ranks` were restarted: their share of every call still in flight is sent again to the
        new ones now, oldest first (the same arguments: nothing lost or drawn twice)."""
        for call in self.in_flight:
            self.keeper.heal(call.pending)


class RecoveringSync(WeightSync):
    """The weight sync to a rollout on its own pool, restarting the replicas that died before or during
    it (the restart's own sync brings every replica to the version)."""

    def __init__(self, keeper: ReplicaKeeper) -> None:
        self.keeper = keeper

    def sync(self, version: int, apply: WeightApply | None = None) -> dict[str, float]:
        return self.keeper.sync(version, apply)


def heal_rollout(
    cfg: QuartetConfig, workers: Workers, weights: WeightSync
) -> tuple[RolloutCalls, WeightSync]:
    """The rollout view and weight sync the loop uses: healing ones when the rollout is on a pool of its own
    and `rollout.max_replica_restarts` > 0 (each restart rewrites the run folder's cluster.json), else the
    plain group and `weights`."""
    plain = RolloutCalls(workers.rollout)
    limit = cfg.rollout.max_replica_restarts
    if limit <= 0 or not isinstance(weights, StreamSync):
        return plain, weights
    hosts = workers.separate[Role.ROLLOUT]
    keeper = ReplicaKeeper(hosts, weights, limit, cfg.rollout.n, cfg.rollout.val.n)
    keeper.on_restart.append(partial(_record, cfg.trainer.run_dir, workers))
    return HealingRollout(keeper, plain), RecoveringSync(keeper)


def _record(run_dir: Path, workers: Workers, ranks: list[int]) -> None:
    """cluster.json names the new hosts' pids (tools find a run's processes there)."""
    record_hosts(run_dir, workers.hosts.names, workers.host_sets)
