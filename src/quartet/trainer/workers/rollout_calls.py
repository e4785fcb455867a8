"""The rollout group's calls as the loop makes them: one view every caller holds, healing or not.

    rollout = RolloutCalls(workers.rollout)                      # the plain group: a death ends the run
    batch = rollout.call_batch(Rollout.generate, prompts)        # as `RoleGroup.call_batch`
    ahead = rollout.submit_batch(Rollout.generate, prompts)      # ahead.get(), ahead.raise_if_failed()
    metrics |= rollout.step_metrics()                            # the view's own per-step metrics

The batch sources, the step and validation call the rollout only through this view, so what happens when
a replica dies is the view's business and none of theirs: this plain one forwards to the group (a dead
replica is the named WorkerError it is), the healing one (`quartet.trainer.recovery.healing`) restarts the
replica inside the same calls. The loop makes no other call on the rollout group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from quartet.cluster.group import RoleGroup
from quartet.core.batch import Batch
from quartet.roles.rollout import Rollout

__all__ = ["InFlight", "RolloutCalls"]

P = ParamSpec("P")
R = TypeVar("R")
J_co = TypeVar("J_co", covariant=True)


class InFlight(Protocol[J_co]):
    """A call running on the rollout replicas (a `Pending`, or the healing view's wrapper of one)."""

    def get(self) -> J_co:
        """Wait for the result."""
        ...

    def raise_if_failed(self) -> None:
        """Without waiting: raise the named error if a replica already failed the call."""
        ...


class RolloutCalls:
    """The rollout group's typed calls (see the module docstring); forwards each to the group."""

    def __init__(self, group: RoleGroup[Rollout]) -> None:
        self.group = group

    def call(self, fn: Callable[Concatenate[Rollout, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """`RoleGroup.call`."""
        return self.group.call(fn, *args, **kwargs)

    def submit(
        self, fn: Callable[Concatenate[Rollout, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> InFlight[list[R]]:
        """`RoleGroup.submit`."""
        return self.group.submit(fn, *args, **kwargs)

    def call_batch(
        self, fn: Callable[Concatenate[Rollout, P], Batch], *args: P.args, **kwargs: P.kwargs
    ) -> Batch:
        """`RoleGroup.call_batch`."""
        return self.group.call_batch(fn, *args, **kwargs)

    def submit_batch(
        self, fn: Callable[Concatenate[Rollout, P], Batch], *args: P.args, **kwargs: P.kwargs
    ) -> InFlight[Batch]:
        """`RoleGroup.submit_batch`."""
        return self.group.submit_batch(fn, *args, **kwargs)

    def step_metrics(self) -> dict[str, float]:
        """What the view did since the last call, as step metrics: nothing for the plain group."""
        return {}
