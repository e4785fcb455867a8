"""A step's named phases: their wall time (`timing_s/<phase>`, verl's names) and their hang deadlines.

`PhaseTimer` is shared by the step and the batch sources that run its generation and scoring phases; each
phase it times is wrapped by its deadline (`quartet.cluster.watchdog` enforces it on the driver's waits).

    deadlines = PhaseDeadlines(cfg.trainer.hang_timeout_s, cfg.cluster.call_timeout_s, run_dir)
    timer = PhaseTimer(guard=deadlines.guard(step))

`trainer.hang_timeout_s` > 0 is the deadline of every phase. 0 (the default) derives it per phase:
`max(HANG_FLOOR_S, HANG_FACTOR x the longest time the phase took in this process's earlier steps)`, and
`HANG_FIRST_S` for a phase not seen yet (the first step). Either way never above `cluster.call_timeout_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from quartet.cluster.watchdog import phase_deadline
from quartet.tracking.run_layout import hang_file

__all__ = ["HANG_FACTOR", "HANG_FIRST_S", "HANG_FLOOR_S", "PhaseDeadlines", "PhaseTimer"]

HANG_FIRST_S = 1800.0
"""The deadline of a phase with no earlier time (the first step, and the first after a resume): nothing is
known of the run's speed yet, that step loads kernels and fills caches, and a long-reasoning generation of
a large batch can legitimately take 10-20 minutes; half the `call_timeout_s` default still names a hang
half an hour sooner than before, and a false kill of a healthy run would cost more than the wait."""
HANG_FLOOR_S = 600.0
"""The least deadline of a phase once it has a time: a phase measured at seconds may still meet a slower
node or a checkpoint's I/O in a later step; ten minutes leaves room for that and is six times sooner than
the `call_timeout_s` default."""
HANG_FACTOR = 5.0
"""A phase's time varies from step to step with response lengths (sampled up to the maximum) and with a
shared node's load, about 2-3x in practice; 5x the longest seen leaves that room and still names a hang
in minutes."""


class PhaseDeadlines:
    """Each phase's deadline from the override or the phase's longest earlier time; remembers times."""

    def __init__(self, override_s: float, cap_s: float, run_dir: Path) -> None:
        self.override_s = override_s
        self.cap_s = cap_s
        self.run_dir = run_dir
        self.longest: dict[str, float] = {}
        """Longest completed time of each phase so far in this process (one entry of it, in seconds)."""

    def timeout_s(self, phase: str) -> float:
        """The deadline of `phase` now, in seconds from its start."""
        if self.override_s > 0:
            return min(self.override_s, self.cap_s)
        if phase not in self.longest:
            return min(self.cap_s, HANG_FIRST_S)
        return min(self.cap_s, max(HANG_FLOOR_S, HANG_FACTOR * self.longest[phase]))

    def record(self, phase: str, seconds: float) -> None:
        """A completed entry of `phase` took `seconds`."""
        self.longest[phase] = max(seconds, self.longest.get(phase, 0.0))

    def guard(self, step: int) -> Callable[[str], AbstractContextManager[None]]:
        """For `PhaseTimer(guard=...)`: each phase of step `step` under its deadline, its time recorded."""

        @contextmanager
        def watched(phase: str) -> Iterator[None]:
            stacks = self.run_dir / hang_file(step)
            with phase_deadline(phase, step, self.timeout_s(phase), stacks):
                start = time.perf_counter()
                yield
                self.record(phase, time.perf_counter() - start)

        return watched


@dataclass
class PhaseTimer:
    """Wall time of named phases: `timing_s/<name>` (a phase entered twice adds up)."""

    seconds: dict[str, float] = field(default_factory=dict)
    on_enter: Callable[[str], None] | None = None
    """Told the name of each phase as it starts (the console's progress bar shows it)."""
    guard: Callable[[str], AbstractContextManager[None]] | None = None
    """Wraps each phase by name: the step's hang deadlines (`PhaseDeadlines`)."""

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.on_enter is not None:
            self.on_enter(name)
        start = time.perf_counter()
        try:
            with self.guard(name) if self.guard is not None else nullcontext():
                yield
        finally:
            self.seconds[f"timing_s/{name}"] = self.seconds.get(f"timing_s/{name}", 0.0) + (
                time.perf_counter() - start
            )
