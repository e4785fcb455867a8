"""The demo (`quartet demo`): SFT start, GRPO, and a time-matched more-SFT control on held-out problems."""

from quartet.demo.pipeline import DEMOS, DemoResult, DemoRow, demo_config, run_demo

__all__ = ["DEMOS", "DemoResult", "DemoRow", "demo_config", "run_demo"]
