"""The teacher of on-policy distillation: a frozen model of its own (`teacher.model_path`) that scores each
token the student sampled, giving `teacher_logprobs` [B, R].

It may be another size or architecture than the policy; it must share the policy's tokenizer (checked on
the driver before any worker starts, `quartet.models.tokenizer_match`), since it scores the student's
token ids as they are. No optimizer and no gradients; with `teacher.param_offload` its parameters wait in
host memory between uses. It runs with the policy's sequence and tensor parallel sizes and the actor's
mixed precision, like the reference (`quartet.roles.frozen`).
"""

from __future__ import annotations

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.model import Dtype
from quartet.config.roles import TeacherConfig
from quartet.core.batch import Batch
from quartet.core.gkd import TEACHER_TOPK_IDS, TEACHER_TOPK_LOGPROBS
from quartet.roles.frozen import FrozenScorer
from quartet.roles.run_values import RunValues

__all__ = ["Teacher"]


class Teacher(FrozenScorer):
    """The frozen teacher on one rank."""

    def __init__(self, cfg: TeacherConfig, run: RunValues, mixed_precision: Dtype) -> None:
        if not cfg.model_path:
            raise ValueError("the teacher role needs teacher.model_path")
        self.rc = cfg
        self.run = run
        super().__init__(cfg.model_path, run, mixed_precision, cfg.logprobs, cfg.param_offload)

    @dispatch(Split.BY_DP_RANK)
    def compute_teacher_logprobs(self, batch: Batch) -> Batch:
        """`teacher_logprobs` [B, R] of the responses under the teacher (the rollout's temperature) and,
        on padded unsplit passes, `teacher_agrees` [B, R] (1 where the teacher's most likely token is the
        sampled one); with GKD (`algorithm.gkd_coef` > 0) its top `gkd_top_k` per position too:
        `teacher_topk_logprobs` and `teacher_topk_ids` [B, R, k]."""
        gkd = self.run.gkd_coef > 0
        run = self.run  # top-k is built for the padded, unsplit head (GKD's config rules refuse the others)
        unsplit = not run.remove_padding and run.sequence_parallel_size == run.tensor_parallel_size == 1
        out = self.response_outputs(batch, top_k=run.gkd_top_k if gkd else int(unsplit))
        columns = {"teacher_logprobs": out.required("logprobs")}
        if out.topk_ids is None:  # packed or split passes: no argmax, no agreement metric
            return Batch(columns, meta=batch.meta)
        ids = out.topk_ids
        columns["teacher_agrees"] = (
            (ids[..., 0] == batch["responses"]) & (batch["response_mask"] > 0)
        ).float()
        if gkd:
            columns[TEACHER_TOPK_LOGPROBS] = out.required("topk_logprobs")
            columns[TEACHER_TOPK_IDS] = ids
        return Batch(columns, meta=batch.meta)
