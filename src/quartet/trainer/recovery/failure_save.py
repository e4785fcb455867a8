"""A checkpoint on a caught failure, of the last completed step only.

A step changes the run's state in two places: the driver (the sampler draws the step's prompts first, the
KL controller updates in the `adv` phase) and the roles (the critic and the actor update their weights and
optimizers, then the rollout engine syncs). A checkpoint is only worth writing when both sides describe the
same step boundary, so `StepBoundary` keeps the driver state of the last completed step (taken when the
step returned, before the next one draws) and notes when the current step enters an update phase:

- failure before any update of step k (generation, a reward function, log-probs, advantages; or between
  steps: validation, records, a periodic save): the roles still hold step k-1's weights, so
  step k-1's driver state is saved with them;
- failure once `update_critic`, `update_actor` or `update_weights` began: some rank may have stepped its
  optimizer, another not; no step boundary describes that state, so nothing is saved (the last
  periodic checkpoint is what `trainer.resume=auto` finds);
- a step already checkpointed, or no completed step (step 0): nothing to add.

Before saving, every host is pinged (`HostSet.health`, 10 s): a dead or silent rank makes the save
impossible and it is skipped at once with a log line, instead of each role call waiting its
`cluster.call_timeout_s`. After a `HangError` the silent ranks are known: no ping, no save. A save that
fails is logged; the caller re-raises the original error either way. Only `Exception`s are handled: a
Ctrl-C or SystemExit leaves at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from quartet.cluster.watchdog import HangError
from quartet.trainer.recovery.checkpoint import TrainerState

__all__ = ["UPDATE_PHASES", "StepBoundary", "save_on_failure"]

log = logging.getLogger(__name__)
UPDATE_PHASES = frozenset({"update_critic", "update_actor", "update_weights"})
HEALTH_TIMEOUT_S = 10.0


class StepBoundary:
    """The driver state of the last completed step, and whether the roles may have moved past it."""

    def __init__(self, saved_step: int = 0) -> None:
        self.last: TrainerState | None = None
        self.saved_step = saved_step
        """The step of the newest checkpoint (the resumed one, or one written by this process)."""
        self.updating = False
        self.phase_name = ""

    def phase(self, name: str) -> None:
        """Told each phase of the running step as it starts (`StepRunner`'s `on_phase`)."""
        self.phase_name = name
        self.updating = self.updating or name in UPDATE_PHASES

    def completed(self, state: TrainerState) -> None:
        """The step of `state` returned: roles and driver agree on it."""
        self.last = state
        self.updating = False
        self.phase_name = ""

    def to_save(self) -> tuple[TrainerState | None, str]:
        """The state a failure now may checkpoint, or None and why not."""
        if self.updating:
            return None, f"it failed in '{self.phase_name}', after a role update began (a half-updated step)"
        if self.last is None:
            return None, "no step completed"
        if self.last.step <= self.saved_step:
            return None, f"step {self.last.step} is already checkpointed"
        return self.last, ""


def save_on_failure(
    boundary: StepBoundary,
    error: BaseException,
    host_sets: Iterable[Any],
    save: Callable[[TrainerState], Path],
) -> Path | None:
    """Checkpoint the last completed step after `error`, when the roles can still be reached; the path, or
    None (logged why). Never raises: the caller re-raises `error`."""
    if not isinstance(error, Exception):
        return None
    state, why = boundary.to_save()
    if state is not None and isinstance(error, HangError):  # no ping: its silent ranks would not answer it
        state, why = None, f"ranks {error.silent} of role '{error.role}' are silent (the hang named above)"
    if state is None:
        log.warning("no checkpoint on failure: %s", why)
        return None
    try:
        for hosts in host_sets:
            hosts.health(HEALTH_TIMEOUT_S)
    except Exception as err:
        log.warning(
            "checkpoint on failure not possible (a rank is unreachable: %s); the last checkpoint is step %d",
            err,
            boundary.saved_step,
        )
        return None
    try:
        path = save(state)
    except Exception as err:  # the original error is what the user must see; this one is logged
        log.warning("checkpoint on failure of step %d failed: %s: %s", state.step, type(err).__name__, err)
        return None
    boundary.saved_step = state.step
    log.warning(
        "after the failure (%s: %s), saved step %d to %s", type(error).__name__, error, state.step, path
    )
    return path
