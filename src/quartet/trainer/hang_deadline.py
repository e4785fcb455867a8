"""The deadline of each phase of a step (`quartet.cluster.watchdog` enforces it on the driver's waits).

    deadlines = PhaseDeadlines(cfg.trainer.hang_timeout_s, cfg.cluster.call_timeout_s, run_dir)
    timer = PhaseTimer(guard=deadlines.guard(step))

`trainer.hang_timeout_s` > 0 is the deadline of every phase. 0 (the default) derives it per phase:
`max(HANG_FLOOR_S, HANG_FACTOR x the longest time the phase took in this process's earlier steps)`, so the
first step gets the floor. Either way it is never above `cluster.call_timeout_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from quartet.cluster.watchdog import phase_deadline
from quartet.tracking.run_layout import hang_file

__all__ = ["HANG_FACTOR", "HANG_FLOOR_S", "PhaseDeadlines"]

HANG_FLOOR_S = 600.0
"""The least deadline of a phase, and the first step's: that step loads kernels, fills caches and warms the
allocator, and a loaded cluster can make it several times slower than later steps; ten minutes is far more
than any tiny-to-mid run's first phase takes, yet six times sooner than the `call_timeout_s` default."""
HANG_FACTOR = 5.0
"""A phase's time varies from step to step with response lengths (sampled up to the maximum) and with a
shared node's load, about 2-3x in practice; 5x the longest seen leaves that room and still names a hang
in minutes."""


class PhaseDeadlines:
    """Each phase's deadline from the override or the phase's longest earlier time; remembers times."""

    def __init__(self, override_s: float, cap_s: float, run_dir: Path) -> None:
        self.override_s, self.cap_s, self.run_dir = override_s, cap_s, run_dir
        self.longest: dict[str, float] = {}
        """Longest completed time of each phase so far in this process (one entry of it, in seconds)."""

    def timeout_s(self, phase: str) -> float:
        """The deadline of `phase` now, in seconds from its start."""
        if self.override_s > 0:
            return min(self.override_s, self.cap_s)
        return min(self.cap_s, max(HANG_FLOOR_S, HANG_FACTOR * self.longest.get(phase, 0.0)))

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
