"""The teacher of on-policy distillation: a frozen model of its own (`teacher.model_path`) that scores each
token the student sampled, giving `teacher_logprobs` [B, R].

It may be another size or architecture than the policy; it must share the policy's tokenizer (checked on
the driver before any worker starts, `quartet.models.tokenizer_match`), since it scores the student's
token ids as they are. No optimizer and no gradients; with `teacher.param_offload` its parameters wait in
host memory between uses. It runs with the policy's sequence and tensor parallel sizes and its own
mixed precision (the actor's), like the reference.
"""

from __future__ import annotations

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.model import Dtype
from quartet.config.roles import TeacherConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.roles.run_values import RunValues

__all__ = ["Teacher"]


class Teacher:
    """The frozen teacher on one rank."""

    def __init__(self, cfg: TeacherConfig, run: RunValues, mixed_precision: Dtype) -> None:
        if not cfg.model_path:
            raise ValueError("the teacher role needs teacher.model_path")
        self.rc = cfg
        self.engine = TrainingEngine(
            EngineSpec(
                cfg.model_path,
                ModelKind.CAUSAL_LM,
                mixed_precision=mixed_precision,
                optim=None,
                param_offload=cfg.param_offload,
                seed=run.seed,
                remove_padding=run.remove_padding,
                sequence_parallel_size=run.sequence_parallel_size,
                tensor_parallel_size=run.tensor_parallel_size,
            )
        )

    @dispatch(Split.BY_DP_RANK)
    def compute_teacher_logprobs(self, batch: Batch) -> Batch:
        """`teacher_logprobs` [B, R] of the responses under the teacher (the rollout's temperature)."""
        if self.rc.param_offload:
            self.engine.onload()
        logprobs, _ = self.engine.forward_logprobs(
            batch, batch.meta.temperature, MicroSpec.from_config(self.rc.logprobs)
        )
        if self.rc.param_offload:
            self.engine.offload()
        return Batch({"teacher_logprobs": logprobs}, meta=batch.meta)
