"""Role groups: the driver's view of one role across all ranks, and pending (non-blocking) calls.

A `RoleGroup[Critic]` exposes exactly the methods `Critic` declares with `@dispatch`; asking for any other
attribute fails on the driver, naming the declared ones. Two ways to call:

    values = critic.compute_values(batch)                 # by attribute, checked against the declarations
    values = critic.call(Critic.compute_values, batch)    # typed: mypy checks the arguments
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar

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
from quartet.core.batch import Batch

if TYPE_CHECKING:
    from quartet.cluster.hostset import HostSet

__all__ = ["Pending", "RoleGroup", "driver_methods"]

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Pending:
    """A call in flight: per-rank results not yet fetched. `get()` waits (bounded) and joins them."""

    group: RoleGroup[Any]
    method: str
    spec: DispatchSpec
    refs: list[Any]  # one ObjectRef per called rank, in rank order
    pad: int

    def get(self, timeout_s: float | None = None) -> Any:
        """Wait for every rank (at most the cluster call timeout), then join the collecting ranks' outputs."""
        outputs = self.group.hosts.wait(self.group.role, self.method, self.refs, timeout_s)
        if self.spec.split is Split.RANK_ZERO:
            return outputs[0]
        layout = self.group.layout
        collecting = sorted((d.dp_rank, r) for r, d in enumerate(layout) if d.collect)
        return join_outputs(self.spec.split, [outputs[r] for _, r in collecting], self.pad)


class _BoundDispatch:
    """`group.method`: calls the declared method on the ranks as its spec says."""

    def __init__(self, group: RoleGroup[Any], name: str, spec: DispatchSpec) -> None:
        self.group, self.name, self.spec = group, name, spec

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.group.invoke(self.name, self.spec, args, kwargs)

    def __repr__(self) -> str:
        return (
            f"<{self.group.role}.{self.name} dispatch={self.spec.split.value} blocking={self.spec.blocking}>"
        )


class RoleGroup(Generic[T]):
    """One role on every host of a `HostSet`; calls are split over ranks and joined as declared."""

    def __init__(self, role: str, cls: type[T], hosts: HostSet) -> None:
        self.role, self.cls, self.hosts = role, cls, hosts
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

    def call(self, fn: Callable[Concatenate[T, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Call a declared `RoleClass.method` (typed); a blocking one returns the joined result."""
        spec = getattr(fn, DISPATCH_ATTR, None)
        name = getattr(fn, "__name__", "")
        if not isinstance(spec, DispatchSpec) or self.methods.get(name) is not spec:
            raise DispatchError(f"{fn!r} is not a @dispatch method of {self.cls.__qualname__}")
        result: R = self.invoke(name, spec, args, kwargs)
        return result

    def execute(self, fn: Callable[Concatenate[T, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Run `fn(role_object, *args, **kwargs)` on every rank; the results in rank order."""
        refs = [h.execute.remote(self.role, fn, args, kwargs) for h in self.hosts.handles]
        outputs: list[R] = self.hosts.wait(self.role, getattr(fn, "__name__", "execute"), refs, None)
        return outputs

    def invoke(self, name: str, spec: DispatchSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        world = self.world_size
        args, kwargs, pad = self._take_pending(spec, args, kwargs)
        if pad is None and spec.split is Split.BY_DP_RANK:
            chunks, pad = split_inputs(spec.split, self.dp_size, args, kwargs)
            per_rank = [chunks[d.dp_rank] for d in self.layout]  # model-parallel peers share a chunk
        elif pad is None:
            per_rank, pad = split_inputs(spec.split, world, args, kwargs)
        else:
            per_rank = [
                (tuple(_rank_part(a, r) for a in args), {k: _rank_part(v, r) for k, v in kwargs.items()})
                for r in range(world)
            ]
        handles = self.hosts.handles[:1] if spec.split is Split.RANK_ZERO else self.hosts.handles
        log.debug("call %s.%s on %d rank(s), pad=%d", self.role, name, len(handles), pad)
        refs = [h.call.remote(self.role, name, a, k) for h, (a, k) in zip(handles, per_rank, strict=True)]
        pending = Pending(self, name, spec, refs, pad)
        return pending.get() if spec.blocking else pending

    def _take_pending(
        self, spec: DispatchSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], int | None]:
        """Pass a pending split call's per-rank results straight to the ranks (no wait on the driver).

        Possible when this call is split too, over the same ranks, and no other Batch argument needs
        splitting; otherwise the pending results are fetched and joined first.
        """
        pendings = [v for v in (*args, *kwargs.values()) if isinstance(v, Pending)]
        if not pendings:
            return args, kwargs, None
        direct = (
            spec.split is Split.BY_DP_RANK
            and all(p.spec.split is Split.BY_DP_RANK and p.group.hosts is self.hosts for p in pendings)
            and len({p.pad for p in pendings}) == 1
            and not any(isinstance(v, Batch) for v in (*args, *kwargs.values()))
            and all(p.group.layout == self.layout for p in pendings)
        )
        if direct:
            return args, kwargs, pendings[0].pad

        def fetch(v: Any) -> Any:
            return v.get() if isinstance(v, Pending) else v

        return tuple(fetch(a) for a in args), {k: fetch(v) for k, v in kwargs.items()}, None


def driver_methods(role: str, cls: type) -> dict[str, DispatchSpec]:
    """The methods `cls` declares for the driver; none at all is an error, raised before any actor starts."""
    methods = declared_methods(cls)
    if not methods:
        raise DispatchError(
            f"role '{role}' ({cls.__qualname__}) declares no method for the driver; "
            "mark the ones the driver calls with @dispatch(Split....)"
        )
    return methods


def _rank_part(value: Any, rank: int) -> Any:
    return value.refs[rank] if isinstance(value, Pending) else value
