"""The demo (`quartet demo`): SFT start, GRPO, and a time-matched more-SFT control on held-out problems
(text tasks; `quartet.demo.vision` for pictures)."""

from quartet.demo.pipeline import (
    DEMOS,
    DEVICES,
    FILTERED_ROW,
    GPU,
    MODELS,
    MOE,
    NO_FILTERED_VISION,
    DemoResult,
    DemoRow,
    cuda_problem,
    demo_config,
    model_problem,
    run_demo,
)

__all__ = [
    "DEMOS",
    "DEVICES",
    "FILTERED_ROW",
    "GPU",
    "MODELS",
    "MOE",
    "NO_FILTERED_VISION",
    "DemoResult",
    "DemoRow",
    "cuda_problem",
    "demo_config",
    "model_problem",
    "run_demo",
]
