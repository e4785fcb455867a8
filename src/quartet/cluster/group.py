"""Role groups: the driver's view of one role across all ranks.

A `RoleGroup[Critic]` calls the methods `Critic` declares with `@dispatch`. The driver names the method as
`Class.method`, so mypy checks the arguments and the result type, and "go to definition" works; how the
results come back is the call form's, checked against the declaration on the driver before any rank runs:

    values = critic.call_batch(Critic.compute_values, batch)   # BY_DP_RANK -> Batch: chunks joined in order
    metrics = critic.call(Critic.update, batch)                 # list[dict[str, float]]: one per dp rank
    path = actor.call_rank_zero(Actor.some_rank_zero_method)    # RANK_ZERO -> rank 0's result
    pending = rollout.submit_batch(Rollout.generate, prompts)   # returns at once; pending.get() -> Batch
    sent = actor.submit(Actor.publish_weights, version)         # returns at once; sent.get() -> list

`submit_batch` and `submit` are the non-blocking forms: with `trainer.mode=one_step_off|async` the driver
generates the next batch (`Rollout.generate` on its own pool) while the actor updates on this one, and
publishes weights while the replicas receive them; `get()` waits (bounded, failures named) when the step
needs the result.

Attribute access (`critic.compute_values(batch)`) calls the same way with the joined result as `Any`: for
tests and interactive use, not for the driver (mypy checks nothing through it). A name that is not a
declared method fails on the driver, naming the declared ones.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

from quartet.cluster.dispatch import (
    DISPATCH_ATTR,
    DataRank,
    DispatchSpec,
    Split,
    declared_methods,
    join_outputs,
    split_inputs,
)
from quartet.cluster.errors import DispatchError
from quartet.cluster.host import LocalRef
from quartet.core.batch import Batch

__all__ = ["Pending", "RoleGroup", "RoleHosts", "driver_methods"]

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
J = TypeVar("J")


class RoleHosts(Protocol):
    """What a group calls through: the host handles in rank order, each role's data layout, and a wait that
    names a failed rank. A `quartet.cluster.hostset.HostSet` is one; it also holds the groups started on it,
    so it sits above this module and the group names only the part it uses."""

    handles: list[Any]

    def layout(self, role: str) -> list[DataRank]: ...

    def wait(self, role: str, method: str, refs: list[Any], timeout_s: float | None) -> list[Any]: ...


@dataclass
class Pending(Generic[J]):
    """A call in flight on the ranks; `get()` waits (at most the cluster call timeout) and joins."""

    group: RoleGroup[Any]
    method: str
    refs: list[Any]  # one ObjectRef per called rank, in rank order
    join: Callable[[list[Any]], J]
    """The collecting ranks' outputs (data-parallel order) -> the call's result."""
    rank_zero: bool = False
    """Only rank 0 was called: its output is the only one."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    """Each called rank's (args, kwargs): what `resubmit` sends again."""
    sent_to: list[Any] = field(default_factory=list)
    """The host handle each rank's call went to (a rank whose host was replaced since has another)."""
    pad: int = 0
    """Rows the split added to the last rank's Batch (left out of the joined result)."""
    _checked: set[Any] = field(default_factory=set)

    def dead_ranks(self) -> list[int]:
        """Without waiting: the ranks whose host process died under this call (not those whose method
        raised: a living host that failed a call is not restarted). A rank that succeeded is looked at
        once."""
        if all(isinstance(r, LocalRef) for r in self.refs):
            return []
        import ray

        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0, fetch_local=False)
        done = set(ready)
        dead = []
        for rank, ref in enumerate(self.refs):
            if ref in self._checked or ref not in done:
                continue
            try:
                ray.get(ref, timeout=1.0)
            except ray.exceptions.RayActorError:
                dead.append(rank)
            except Exception:  # still on its way here, or the method raised: not a death
                continue
            else:
                self._checked.add(ref)
        return dead

    def resubmit(self, ranks: list[int]) -> None:
        """Send the call of `ranks` again, with the same arguments, to the hosts now at those ranks."""
        handles = self.group.hosts.handles
        for rank in ranks:
            args, kwargs = self.calls[rank]
            self.refs[rank] = handles[rank].call.remote(self.group.role, self.method, args, kwargs)
            self.sent_to[rank] = handles[rank]

    def raise_if_failed(self) -> None:
        """Without waiting: raise the named WorkerError if a rank of this call already failed (its actor
        died, or the method raised); results of ranks that finished stay where they are."""
        if all(isinstance(r, LocalRef) for r in self.refs):
            return
        import ray

        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0, fetch_local=False)
        for ref in ready:
            if ref in self._checked:
                continue
            try:
                ray.get(ref, timeout=1.0)
            except ray.exceptions.GetTimeoutError:
                continue  # still on its way here: looked at again next time
            except Exception:
                self.group.hosts.wait(self.group.role, self.method, self.refs, 30.0)  # names the failure
                raise
            self._checked.add(ref)

    def get(self, timeout_s: float | None = None) -> J:
        outputs = self.group.hosts.wait(self.group.role, self.method, self.refs, timeout_s)
        if self.rank_zero:
            return self.join(outputs)
        collecting = sorted((d.dp_rank, r) for r, d in enumerate(self.group.layout) if d.collect)
        return self.join([outputs[r] for _, r in collecting])


class _BoundDispatch:
    """`group.method`: calls the declared method on the ranks as its spec says; the result untyped."""

    def __init__(self, group: RoleGroup[Any], name: str, spec: DispatchSpec) -> None:
        self.group = group
        self.name = name
        self.spec = spec

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        split = self.spec.split
        pending = self.group._start(
            self.name, self.spec, args, kwargs, lambda outputs, pad: join_outputs(split, outputs, pad)
        )
        return pending.get()

    def __repr__(self) -> str:
        return f"<{self.group.role}.{self.name} dispatch={self.spec.split.value}>"


class RoleGroup(Generic[T]):
    """One role on every host of a `HostSet`; calls are split over ranks and joined as declared."""

    def __init__(self, role: str, cls: type[T], hosts: RoleHosts) -> None:
        self.role = role
        self.cls = cls
        self.hosts = hosts
        self.methods = driver_methods(role, cls)

    @property
    def world_size(self) -> int:
        """Ranks (host processes) of the group."""
        return len(self.hosts.handles)

    @property
    def layout(self) -> list[DataRank]:
        """Data-parallel rank and collecting flag of each rank, as the role objects reported them."""
        return self.hosts.layout(self.role)

    @property
    def dp_size(self) -> int:
        """Number of chunks a split call cuts its Batch into."""
        return self.layout[0].dp_size

    def __getattr__(self, name: str) -> _BoundDispatch:
        methods = self.__dict__.get("methods")
        if methods is None or name.startswith("__"):
            raise AttributeError(name)
        if name not in methods:
            exists = callable(getattr(self.__dict__["cls"], name, None))
            why = "is not declared with @dispatch" if exists else "does not exist"
            raise DispatchError(
                f"{self.__dict__['cls'].__qualname__}.{name} {why}; the driver can call: {sorted(methods)}"
            )
        return _BoundDispatch(self, name, methods[name])

    # ---- typed calls ------------------------------------------------------------------------------------

    def call(self, fn: Callable[Concatenate[T, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """A BY_DP_RANK or BROADCAST method: each data-parallel rank's result, in rank order (a split call's
        Batch arguments are padded to a multiple of the ranks; the last rank's result covers the padding)."""
        return self.submit(fn, *args, **kwargs).get()

    def submit(
        self, fn: Callable[Concatenate[T, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> Pending[list[R]]:
        """`call` without waiting: the ranks start now; `get()` gives each data-parallel rank's result."""
        name, spec = self._declared(fn, {Split.BY_DP_RANK, Split.BROADCAST}, "call_rank_zero")
        return self._start(name, spec, args, kwargs, lambda outputs, _pad: list(outputs))

    def call_batch(self, fn: Callable[Concatenate[T, P], Batch], *args: P.args, **kwargs: P.kwargs) -> Batch:
        """A BY_DP_RANK method returning a Batch: the ranks' Batches joined in order, padding removed."""
        return self.submit_batch(fn, *args, **kwargs).get()

    def submit_batch(
        self, fn: Callable[Concatenate[T, P], Batch], *args: P.args, **kwargs: P.kwargs
    ) -> Pending[Batch]:
        """`call_batch` without waiting: the ranks start now; `get()` gives the joined Batch."""
        name, spec = self._declared(fn, {Split.BY_DP_RANK}, "call")
        return self._start(name, spec, args, kwargs, lambda outputs, pad: Batch.concat(outputs).unpad(pad))

    def call_rank_zero(self, fn: Callable[Concatenate[T, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
        """A RANK_ZERO method: only rank 0 runs it; its result."""
        name, spec = self._declared(fn, {Split.RANK_ZERO}, "call")
        result: R = self._start(name, spec, args, kwargs, lambda outputs, _pad: outputs[0]).get()
        return result

    def execute(self, fn: Callable[Concatenate[T, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Run any `fn(role_object, *args, **kwargs)` on every rank (no split); the results in rank order."""
        refs = [h.execute.remote(self.role, fn, args, kwargs) for h in self.hosts.handles]
        outputs: list[R] = self.hosts.wait(self.role, getattr(fn, "__name__", "execute"), refs, None)
        return outputs

    # ---- mechanics --------------------------------------------------------------------------------------

    def _declared(self, fn: Callable[..., Any], splits: set[Split], other: str) -> tuple[str, DispatchSpec]:
        spec = getattr(fn, DISPATCH_ATTR, None)
        name = getattr(fn, "__name__", "")
        if not isinstance(spec, DispatchSpec) or self.methods.get(name) is not spec:
            raise DispatchError(f"{fn!r} is not a @dispatch method of {self.cls.__qualname__}")
        if spec.split not in splits:
            raise DispatchError(
                f"{self.cls.__qualname__}.{name} is declared {spec.split.value}; call it with .{other}()"
            )
        return name, spec

    def _start(
        self,
        name: str,
        spec: DispatchSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        join: Callable[[list[Any], int], J],
    ) -> Pending[J]:
        """Send the call to the ranks as `spec` splits it; `join(outputs, padding rows)` makes the result."""
        if spec.split is Split.BY_DP_RANK:
            chunks, pad = split_inputs(spec.split, self.dp_size, args, kwargs)
            per_rank = [chunks[d.dp_rank] for d in self.layout]  # model-parallel peers share a chunk
        else:
            per_rank, pad = split_inputs(spec.split, self.world_size, args, kwargs)
        handles = self.hosts.handles[:1] if spec.split is Split.RANK_ZERO else self.hosts.handles
        log.debug("call %s.%s on %d rank(s), pad=%d", self.role, name, len(handles), pad)
        refs = [h.call.remote(self.role, name, a, k) for h, (a, k) in zip(handles, per_rank, strict=True)]
        rank_zero = spec.split is Split.RANK_ZERO
        calls = list(per_rank[: len(handles)])
        return Pending(
            self, name, refs, lambda outputs: join(outputs, pad), rank_zero, calls, list(handles), pad=pad
        )


def driver_methods(role: str, cls: type) -> dict[str, DispatchSpec]:
    """The methods `cls` declares for the driver; none at all is an error, raised before any actor starts."""
    methods = declared_methods(cls)
    if not methods:
        raise DispatchError(
            f"role '{role}' ({cls.__qualname__}) declares no method for the driver; "
            "mark the ones the driver calls with @dispatch(Split....)"
        )
    return methods
