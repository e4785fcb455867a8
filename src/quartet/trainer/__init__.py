"""The RL driver: one step as named phases (`step.py`), the loop and records (`rl_trainer.py`)."""

from quartet.trainer.loop.rl_trainer import RLResult, RLTrainer

__all__ = ["RLResult", "RLTrainer"]
