"""The local backend: the same role groups and dispatch, in this process, without Ray.

`cluster.backend=local` runs one rank per role as plain objects in the driver process, so a whole RL step
can be stepped through in a debugger (breakpoints inside role methods work), and quartet runs where Ray
is not installed. Calls run synchronously when made; a non-blocking call returns a `Pending` whose
results are already there. Errors surface as the same `WorkerError` as on Ray, chained to the original
exception so its traceback is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quartet.cluster.colocate import RoleSpec, check_roles, start_roles
from quartet.cluster.host import LocalRef, RoleHost
from quartet.cluster.hostset import HostSet
from quartet.cluster.naming import RunNames

__all__ = ["LocalHandle", "colocate_local"]


class _LocalMethod:
    """`handle.method.remote(...)`, as on a Ray actor handle, but run now in this process."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> LocalRef:
        try:
            return LocalRef(self.fn(*args, **kwargs))
        except Exception as err:  # reported by HostSet.wait with role, rank and node
            return LocalRef(error=err)


class LocalHandle:
    """Stands in for a Ray actor handle of a `RoleHost` living in this process."""

    def __init__(self, host: RoleHost) -> None:
        self.host = host

    def __getattr__(self, name: str) -> _LocalMethod:
        if name.startswith("__"):
            raise AttributeError(name)
        return _LocalMethod(getattr(self.__dict__["host"], name))


def colocate_local(
    names: RunNames, label: str = "", call_timeout_s: float = 3600.0, **roles: RoleSpec
) -> HostSet:
    """Construct every role once (rank 0 of world 1) in this process; return the HostSet of one host."""
    check_roles(roles)
    hosts = HostSet(None, names, label or "-".join(roles), call_timeout_s)
    hosts.handles.append(LocalHandle(RoleHost(0, 1, 0, names.actor_name(hosts.label, 0), in_process=True)))
    return start_roles(hosts, roles, call_timeout_s)
