"""What each demo is expected to take and to show, printed before it starts (and, for `--quick`, after its
table): a newcomer should know whether to wait two minutes or twenty, and whether a table of a smoke run
means anything.

The times were measured on a 2-core CPU (AMD EPYC, 24 GiB) with nothing else running, by
`benchmarks/demo_times.py` (`benchmarks/results/demo_times.json`), except where `measured` says otherwise;
a busy or slower machine takes longer.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXPECTATIONS", "DemoExpectation", "closing_note", "expectation", "opening_note"]


@dataclass(frozen=True)
class DemoExpectation:
    """One demo's wall time on a 2-core CPU and what its table can and cannot tell."""

    seconds: float
    """The whole command, models built to table printed (the install of `make demo` not included)."""
    shows: str
    cannot_show: str = ""
    """Empty when the table is the real comparison."""
    measured: str = "benchmarks/demo_times.py"

    def duration(self) -> str:
        """`~N min` (or `~N s` under two minutes)."""
        return f"~{self.seconds:.0f} s" if self.seconds < 120 else f"~{self.seconds / 60:.0f} min"


MOE_STEP_RATIO = 1.57
"""The MoE demo model's step time over the dense one's (`benchmarks/moe_cost.py`, the two measured in turns
in one run): the larger of the GRPO-sized and the SFT-sized update's ratios (`update_s`, `small_update_s`
of benchmarks/results/moe_cost.json's `summary.moe_over_dense`), to 2 decimals."""

MOE_ESTIMATE = (
    f"estimated: the dense demo's time x {MOE_STEP_RATIO}, the MoE / dense step time of "
    "benchmarks/moe_cost.py"
)
"""What `--model moe`'s times are: the machine they were measured on was too busy to time the demo alone."""


def _moe_estimate(dense_seconds: float) -> float:
    """The `--model moe` demo's expected seconds from the dense demo's measured ones, to 5 s."""
    return 5 * round(dense_seconds * MOE_STEP_RATIO / 5)


SMOKE = "a smoke of the pipeline: every stage runs (SFT start, GRPO, the control, the scoring, the table)"

EXPECTATIONS: dict[tuple[str, bool, str], DemoExpectation] = {
    ("arithmetic", False, "dense"): DemoExpectation(
        520,
        "what GRPO adds over the same training time of more SFT, on 200 held-out problems",
        measured="`make demo` in a fresh clone: its 'whole demo' line, 521 s",
    ),
    ("arithmetic", True, "dense"): DemoExpectation(
        130,
        SMOKE,
        "which row is better: 40 SFT epochs and 20 GRPO steps are too few, the margins are noise",
    ),
    ("calculator", False, "dense"): DemoExpectation(
        420,
        "GRPO over whole conversations learning when to call the tool, against more SFT",
        measured="docs/agentic.md (seed 0, under 7 minutes)",
    ),
    ("calculator", True, "dense"): DemoExpectation(
        135, SMOKE, "which row is better: 8 SFT epochs and 4 GRPO steps are too few, the margins are noise"
    ),
    ("vision", False, "dense"): DemoExpectation(
        2160,
        "GRPO against more SFT on counting circles; one seed is noisy (docs/vision.md: 3 seeds, GRPO won 1)",
        measured="docs/vision.md (36 min each with three seeds sharing the 2 cores; not timed alone)",
    ),
    ("vision", True, "dense"): DemoExpectation(
        25,
        SMOKE,
        "anything about accuracy: 10 SFT steps and 3 GRPO steps leave the model guessing, the rows are noise",
    ),
}
"""(task, quick, model) -> expectation, on CPU (model: `quartet demo --model`). The GPU demo has its own
estimate (`quartet.demo.GPU`)."""

EXPECTATIONS[("arithmetic", False, "moe")] = DemoExpectation(
    1185,  # at a load average of 2-4 on the 2 cores: a quiet machine is faster (the estimate: ~815 s)
    "what GRPO adds over the same training time of more SFT with a tiny mixture-of-experts model, on 200 "
    "held-out problems",
)
EXPECTATIONS[("arithmetic", True, "moe")] = DemoExpectation(
    _moe_estimate(EXPECTATIONS[("arithmetic", True, "dense")].seconds),
    SMOKE,
    EXPECTATIONS[("arithmetic", True, "dense")].cannot_show,  # the same epochs and steps as the dense smoke
    measured=MOE_ESTIMATE,
)


def expectation(task: str, quick: bool, device: str = "cpu", model: str = "dense") -> DemoExpectation | None:
    """The expectation of a CPU demo; None on a GPU (sized, not yet timed there)."""
    return EXPECTATIONS.get((task, quick, model)) if device == "cpu" else None


def opening_note(task: str, quick: bool, device: str = "cpu", model: str = "dense") -> str:
    """The line printed before a demo starts."""
    found = expectation(task, quick, device, model)
    if found is None:
        return "expected: under 5 minutes on one H100 (an estimate: not yet timed on a GPU)"
    text = f"expected: {found.duration()} on a 2-core CPU ({found.measured}); shows {found.shows}"
    if found.cannot_show:
        text += f"; cannot show {found.cannot_show}"
    return text


def closing_note(task: str, quick: bool, device: str = "cpu", model: str = "dense") -> str | None:
    """The line printed under the table of a run whose table is not the comparison (`--quick`), else None."""
    found = expectation(task, quick, device, model)
    if found is None or not found.cannot_show:
        return None
    full = EXPECTATIONS.get((task, False, model))
    command = "quartet demo" + ("" if task == "arithmetic" else f" --task {task}")
    command += "" if model == "dense" else f" --model {model}"
    took = f" ({full.duration()})" if full is not None else ""
    return (
        f"--quick is {SMOKE}; the table above says nothing about which row is better. {command}{took} does."
    )
