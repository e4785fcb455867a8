"""Named exceptions of the cluster layer; each message says what was expected and what was found."""

from __future__ import annotations

__all__ = ["DispatchError", "ResourcesUnavailableError", "WorkerDiscoveryError", "WorkerError"]


class DispatchError(TypeError):
    """A role method is missing, undeclared, or called with arguments its dispatch cannot split."""


class ResourcesUnavailableError(RuntimeError):
    """The cluster cannot hold the requested resource pool (checked up front, or after a bounded wait)."""


class WorkerDiscoveryError(LookupError):
    """Fewer workers than expected were found by (address, namespace, prefix)."""


class WorkerError(RuntimeError):
    """A call on a worker failed: the actor died, raised, or did not answer in time."""

    def __init__(self, role: str, rank: int, node: str, cause: str) -> None:
        self.role = role
        self.rank = rank
        self.node = node
        self.cause = cause
        super().__init__(f"role '{role}' rank {rank} on node {node}: {cause}")
