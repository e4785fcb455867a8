"""The run settings the distillation tests share (imported as `distill_settings`, as `tiny_shapes` is): two
GRPO-sized steps of distillation alone, where the advantage is the teacher's signal only."""

from __future__ import annotations

DISTILL = [
    "algorithm.distill_coef=1.0",
    "algorithm.distill_task_coef=0.0",  # distillation alone: the advantage is the teacher's signal only
    "data.builtin_train_size=32",
    "data.builtin_val_size=8",
    "data.train_batch_size=4",
    "rollout.n=2",
    "actor.mini_batch_size=4",
    "actor.micro_batch_size_per_device=8",
    "trainer.total_steps=2",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.loggers=[jsonl]",
]
