"""The demo (`quartet demo`): SFT start, GRPO, and a time-matched more-SFT control on held-out problems."""

from quartet.demo.pipeline import DEMOS, FILTERED_ROW, DemoResult, DemoRow, demo_config, run_demo

__all__ = ["DEMOS", "FILTERED_ROW", "DemoResult", "DemoRow", "demo_config", "run_demo"]
