"""The demo (`quartet demo`): SFT start, GRPO, and a time-matched more-SFT control on held-out problems."""

from quartet.demo.pipeline import (
    DEMOS,
    DEVICES,
    FILTERED_ROW,
    GPU,
    DemoResult,
    DemoRow,
    cuda_problem,
    demo_config,
    run_demo,
)

__all__ = [
    "DEMOS",
    "DEVICES",
    "FILTERED_ROW",
    "GPU",
    "DemoResult",
    "DemoRow",
    "cuda_problem",
    "demo_config",
    "run_demo",
]
