"""A frozen causal LM that scores the responses' tokens: what the reference and the teacher share.

No optimizer and no gradients; with `param_offload` its parameters wait in host memory between uses (GPU
only; a no-op on CPU). It is split as the policy is (the run's sequence and tensor parallel sizes).
"""

from __future__ import annotations

from typing import Any

import torch

from quartet.config.model import Dtype
from quartet.config.roles import MicroBatching
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, ModelOutputs
from quartet.roles.run_values import RunValues

__all__ = ["FrozenScorer"]


class FrozenScorer:
    """One rank of a frozen causal LM giving log-probs of the batch's responses."""

    def __init__(
        self,
        model_path: str,
        run: RunValues,
        mixed_precision: Dtype,
        micro: MicroBatching,
        param_offload: bool,
        **spec: Any,
    ) -> None:
        """`spec`: more `EngineSpec` fields (the reference's expert split and routing replay)."""
        from quartet.engines import TrainingEngine  # the host's import, not the driver's (it reads @dispatch)

        self.micro = micro
        self.param_offload = param_offload
        self.engine = TrainingEngine(
            EngineSpec(
                model_path,
                ModelKind.CAUSAL_LM,
                mixed_precision=mixed_precision,
                optim=None,
                param_offload=param_offload,
                seed=run.seed,
                remove_padding=run.remove_padding,
                shared_prompts=run.shared_prompts,
                sequence_parallel_size=run.sequence_parallel_size,
                tensor_parallel_size=run.tensor_parallel_size,
                **spec,
            )
        )

    def response_logprobs(self, batch: Batch) -> torch.Tensor:
        """[B, R] log-probs of the responses at the rollout's temperature (onloaded for the pass)."""
        return self.response_outputs(batch).required("logprobs")

    def response_outputs(self, batch: Batch, top_k: int = 0) -> ModelOutputs:
        """The responses' log-probs [B, R] at the rollout's temperature, and with `top_k` > 0 each response
        position's k most likely tokens (`topk_logprobs`, `topk_ids` [B, R, k]); onloaded for the pass."""
        from quartet.engines.head_outputs import ExtraOutputs

        if self.param_offload:
            self.engine.onload()
        try:
            return self.engine.forward_policy(
                batch,
                batch.meta.temperature,
                MicroSpec.from_config(self.micro),
                extras=ExtraOutputs(top_k=top_k),
            )
        finally:
            if self.param_offload:
                self.engine.offload()
