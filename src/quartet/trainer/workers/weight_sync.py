"""The driver's side of the weight sync: bringing the rollout replicas up to the actor after an update.

    weights = open_weight_sync(cfg, workers)     # after start_workers; opens the stream when separate
    metrics = weights.sync(version)              # every replica holds the actor's weights `version`

- The rollout on the actor's pool (`InProcessSync`): each rollout copies its sibling actor's weights in its
  own process (`Rollout.sync_weights`).
- The rollout on a pool of its own (`StreamSync`, `cluster.separate_pools=[rollout]`): actor rank 0 and
  every replica form a weight-sync group once at start (`quartet.roles.weight_stream` over
  `quartet.weight_sync`); each sync publishes the weights numbered by a version, and each replica receives
  them while it generates (with every replica on the actor's node and the weights on CUDA, the buckets
  travel as CUDA IPC handles: `rollout.weight_sync.transport`). A sync is bounded by
  `rollout.weight_sync.timeout_s` plus a grace; a replica that dies mid-sync is named at once, one that lags
  is named with its node, and the error says whether the actor had sent everything.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable

from quartet.cluster.colocate import HostSet
from quartet.cluster.errors import WorkerError
from quartet.cluster.group import Pending, RoleGroup
from quartet.cluster.hostset import add_sentinel, remove_sentinel
from quartet.config import QuartetConfig, Role
from quartet.config.rollout import WeightApply, WeightTransport
from quartet.roles.actor import Actor
from quartet.roles.rollout import Rollout
from quartet.trainer.workers.start import Workers, mean_over_ranks

__all__ = ["InProcessSync", "StreamSync", "WeightSync", "open_weight_sync"]

log = logging.getLogger(__name__)

_RECEIVE_GRACE_S = 10.0
"""How much longer than the sync timeout the driver waits for replicas once the actor has sent everything."""


class WeightSync(ABC):
    """Brings every rollout replica to the actor's current weights."""

    @abstractmethod
    def sync(self, version: int, apply: WeightApply | None = None) -> dict[str, float]:
        """Sync the actor's current weights, numbered `version`; the sync's metrics (`weight_sync/*`).

        `apply` overrides `rollout.weight_sync.apply` for this sync (one_step_off applies after draining).
        """


class InProcessSync(WeightSync):
    """The rollout shares the actor's host processes: each replica copies its sibling's weights."""

    def __init__(self, rollout: RoleGroup[Rollout]) -> None:
        self.rollout = rollout

    def sync(self, version: int, apply: WeightApply | None = None) -> dict[str, float]:
        synced = mean_over_ranks(self.rollout.call(Rollout.sync_weights, version))
        return {k: v for k, v in synced.items() if "timing" not in k}


class StreamSync(WeightSync):
    """The rollout on its own pool: weights travel over the weight-sync group that `open` forms."""

    def __init__(
        self,
        actor: RoleGroup[Actor],
        rollout: RoleGroup[Rollout],
        rollout_hosts: HostSet,
        timeout_s: float,
        transport: WeightTransport = WeightTransport.AUTO,
    ) -> None:
        self.actor = actor
        self.rollout = rollout
        self.rollout_hosts = rollout_hosts
        self.timeout_s = timeout_s
        """`rollout.weight_sync.timeout_s`: the bound on one sync."""
        self.transport = WeightTransport(transport)
        """`rollout.weight_sync.transport`: the actor picks the transport of each sync from it."""
        self.bucket_bytes = 0

    def open(self, bucket_bytes: int) -> None:
        """Form the weight-sync group: actor rank 0 listens, every rollout replica joins (bounded waits)."""
        self.bucket_bytes = bucket_bytes
        receivers, timeout_s = self.rollout.world_size, self.timeout_s
        opened = self.actor.call(Actor.open_weight_stream, receivers, bucket_bytes, timeout_s)[0]
        assert opened is not None, "actor rank 0 opens the weight stream"
        host, port = opened
        same_node = self._all_on_node(host)
        joins = self.rollout.submit(Rollout.join_weight_stream, host, port, receivers + 1, timeout_s)
        self.actor.call(Actor.accept_weight_stream, self.transport, same_node)
        joins.get(timeout_s + 30.0)
        log.info(
            "weight stream open: actor rank 0 at %s:%d -> %d rollout replica(s) (transport %s, same node %s)",
            host,
            port,
            receivers,
            self.transport.value,
            same_node,
        )

    def _all_on_node(self, host: str) -> bool:
        """Whether every rollout replica runs on the node at `host` (actor rank 0's); an explicit same-node
        transport with a replica elsewhere is refused here, before anyone waits on the group."""
        ips = [_node_ip(self.rollout_hosts, rank) for rank in range(self.rollout.world_size)]
        same_node = all(ip == host for ip in ips)
        if not same_node and self.transport in (WeightTransport.CUDA_IPC, WeightTransport.SHM):
            raise ValueError(
                f"rollout.weight_sync.transport={self.transport.value} needs every rollout replica on the "
                f"actor's node {host}, but they run on {sorted({str(ip) for ip in ips})}; use auto or gloo"
            )
        return same_node

    def reopen(self, version: int, apply: WeightApply | None = None) -> dict[str, float]:
        """Form the group again after a member died: the actor and every replica leave the old one, all
        join a new one on a fresh port (bounded as at start), and every replica gets weights `version`
        (a new replica holds only the initial model)."""
        self.actor.call(Actor.close_weight_stream)
        self.rollout.submit(Rollout.leave_weight_stream).get(self.timeout_s + _RECEIVE_GRACE_S)
        self.open(self.bucket_bytes)
        return self._sync_once(version, apply)

    def sync(self, version: int, apply: WeightApply | None = None) -> dict[str, float]:
        return self._sync_once(version, apply)

    def _sync_once(
        self,
        version: int,
        apply: WeightApply | None = None,
        on_failure: Callable[[Pending[list[dict[str, float]]]], None] | None = None,
    ) -> dict[str, float]:
        """One sync of `version`; `on_failure(received)` is told of a failed one before it is named."""
        sent = self.actor.submit(Actor.publish_weights, version)
        received = self.rollout.submit(Rollout.receive_weights, apply)
        try:
            return self._finish(version, sent, received)
        except WorkerError:
            if on_failure is not None:
                on_failure(received)
            raise

    def _finish(
        self,
        version: int,
        sent: Pending[list[dict[str, float]]],
        received: Pending[list[dict[str, float]]],
    ) -> dict[str, float]:
        """Wait for both ends of a sync; its metrics, or the WorkerError naming the replica at fault."""
        sent_metrics = self._sent(version, sent, received)
        try:  # the actor finished sending: a replica has this long to finish taking it in
            got = received.get(self.timeout_s + _RECEIVE_GRACE_S)
        except WorkerError as err:
            moved = int(sent_metrics.get("weight_sync/bytes", 0))
            raise WorkerError(
                Role.ROLLOUT,
                err.rank,
                err.node,
                f"weight sync of version {version}: the actor sent all {moved} bytes, but this replica did "
                f"not finish receiving and applying them: {err.cause}",
            ) from err
        return sent_metrics | mean_over_ranks(got)

    def _sent(
        self,
        version: int,
        sent: Pending[list[dict[str, float]]],
        received: Pending[list[dict[str, float]]],
    ) -> dict[str, float]:
        """The actor's side of the sync, once it has sent everything; a failure there names the first
        replica still receiving (a replica that dies meanwhile is named at once)."""
        add_sentinel(received.raise_if_failed)
        try:  # the actor's sync is bounded by the timeout, its gather included
            published = sent.get(self.timeout_s + _RECEIVE_GRACE_S)
        except WorkerError as err:
            if "WeightSyncError" not in err.cause:
                raise  # the actor itself failed (died, ran out of memory): its own error says so
            rank, node = self._lagging(received)
            raise WorkerError(
                Role.ROLLOUT,
                rank,
                node,
                f"weight sync of version {version} failed on the actor's side: {err.cause}",
            ) from err
        finally:
            remove_sentinel(received.raise_if_failed)
        return mean_over_ranks(published)

    def _lagging(self, received: Pending[list[dict[str, float]]]) -> tuple[int, str]:
        """The first rollout replica whose receive has not finished (rank 0 when all did) and its node."""
        import ray

        done, _ = ray.wait(received.refs, num_returns=len(received.refs), timeout=0, fetch_local=False)
        lagging = [rank for rank, ref in enumerate(received.refs) if ref not in done]
        rank = lagging[0] if lagging else 0
        return rank, self.rollout_hosts.node_of(rank)


def _node_ip(hosts: HostSet, rank: int) -> str | None:
    """The IP of the node running `rank` of a pool (None when unknown, e.g. before the hosts reported)."""
    if rank < len(hosts.nodes):
        return str(hosts.nodes[rank]["ip"])
    slots = hosts.pool.slots if hosts.pool else []
    return str(slots[rank].node_ip) if rank < len(slots) else None


def open_weight_sync(cfg: QuartetConfig, workers: Workers) -> WeightSync:
    """The run's weight sync; with the rollout on its own pool, the stream is opened here (the caller shuts
    the workers down if this fails)."""
    if not workers.rollout_separate:
        return InProcessSync(workers.rollout)
    settings = cfg.rollout.weight_sync
    hosts = workers.separate[Role.ROLLOUT]
    stream = StreamSync(workers.actor, workers.rollout, hosts, settings.timeout_s, settings.transport)
    stream.open(settings.bucket_bytes)
    return stream
