"""Wall time of a step's named phases (`timing_s/<phase>`, verl's names), shared by the step and the batch
sources that run its generation and scoring phases."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

__all__ = ["PhaseTimer"]


@dataclass
class PhaseTimer:
    """Wall time of named phases: `timing_s/<name>` (a phase entered twice adds up)."""

    seconds: dict[str, float] = field(default_factory=dict)
    on_enter: Callable[[str], None] | None = None
    """Told the name of each phase as it starts (the console's progress bar shows it)."""
    guard: Callable[[str], AbstractContextManager[None]] | None = None
    """Wraps each phase by name: the step's hang deadlines (`quartet.trainer.records.hang_deadline`)."""

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
