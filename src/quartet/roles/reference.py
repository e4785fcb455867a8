"""The reference policy: a frozen copy of the initial policy, giving `ref_logprobs` for the KL terms.

No optimizer and no gradients; with `reference.param_offload` its parameters wait in host memory between
uses. With LoRA the actor serves the reference itself (adapters disabled) and this role is not started.
"""

from __future__ import annotations

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.root import QuartetConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine

__all__ = ["Reference"]


class Reference:
    """The frozen initial policy on one rank."""

    def __init__(self, cfg: QuartetConfig, model_path: str) -> None:
        self.rc = cfg.reference
        self.engine = TrainingEngine(
            EngineSpec(
                model_path,
                ModelKind.CAUSAL_LM,
                mixed_precision=cfg.actor.mixed_precision,
                optim=None,
                param_offload=self.rc.param_offload,
                seed=cfg.trainer.seed,
            )
        )

    @dispatch(Split.BY_DP_RANK)
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """`ref_logprobs` [B, R] of the responses under the initial policy (same temperature as rollout)."""
        if self.rc.param_offload:
            self.engine.onload()
        logprobs, _ = self.engine.forward_logprobs(
            batch, batch.meta.temperature, MicroSpec.from_config(self.rc.logprobs)
        )
        if self.rc.param_offload:
            self.engine.offload()
        return Batch({"ref_logprobs": logprobs}, meta=batch.meta)
