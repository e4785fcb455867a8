"""Where a run's time goes before its first step: the `startup` record.

`quartet train` spends seconds before the first step: Python imports, preparing data and the memory plan,
starting trackers and the reward pool, connecting to (or starting) Ray, placing the pool, starting the host
processes and building each role (its model loaded). The trainer times each phase with a `StartupClock`
and writes one record after the first step of the process:

    {"kind": "startup", "step": N, "imports_s": .., "prepare_s": .., "trackers_s": .., "reward_pool_s": ..,
     "workers_s": .., "workers/connect_s": .., "workers/pool_s": .., "workers/hosts_s": ..,
     "workers/role/actor_s": .., ..., "first_step_s": .., "to_first_step_s": .., "to_first_step_end_s": ..}

`imports_s` runs from the process's first import of quartet (`quartet.IMPORTED_AT`, right after the
interpreter starts when the `quartet` command runs) to the trainer's creation: the CLI's imports (torch,
transformers, Ray). `to_first_step_s` runs from that same point to the first step's start. An SFT warm start
that `quartet train` ran in the same process first is reported apart, as `sft_warm_start_s` (`set_aside`).
`benchmarks/startup.py` compares these with TRL's, measured from outside the process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

__all__ = ["StartupClock", "since_import_s"]

T = TypeVar("T")


def since_import_s() -> float:
    """Seconds since this process first imported quartet."""
    import quartet

    return max(0.0, time.time() - quartet.IMPORTED_AT)


class StartupClock:
    """Laps of the phases before the first step, in seconds."""

    def __init__(self) -> None:
        self.imports_s = since_import_s()
        self.created = time.perf_counter()
        self.phases: dict[str, float] = {}
        self.last = self.created
        self.reported = False

    def set_aside(self, name: str, seconds: float) -> None:
        """Report `seconds` that ran before the trainer was created but were no import (an SFT warm start
        in the same process) as the phase `name`, not in `imports_s`; `to_first_step_s` keeps them."""
        self.imports_s = max(0.0, self.imports_s - seconds)
        self.phases[name] = seconds
        self.created -= seconds  # the span since the imports stays the same length

    def mark(self) -> None:
        """Start the next lap now."""
        self.last = time.perf_counter()

    def lap(self, name: str, parts: Mapping[str, float] | None = None) -> None:
        """End a lap called `name` (with its own breakdown `parts`, reported as `name/part`)."""
        now = time.perf_counter()
        self.phases[name] = now - self.last
        for part, seconds in (parts or {}).items():
            self.phases[f"{name}/{part}"] = seconds
        self.last = now

    def timed(self, name: str, fn: Callable[[], T]) -> T:
        self.mark()
        out = fn()
        self.lap(name)
        return out

    def report(self, first_step_s: float) -> dict[str, float]:
        """The record's values; marks the clock reported."""
        self.reported = True
        end = time.perf_counter() - self.created + self.imports_s
        out = {"imports_s": self.imports_s, **{f"{k}_s": v for k, v in self.phases.items()}}
        out |= {
            "first_step_s": first_step_s,
            "to_first_step_s": end - first_step_s,
            "to_first_step_end_s": end,
        }
        return {k: round(v, 4) for k, v in out.items()}
