"""The reference policy: a frozen copy of the initial policy, giving `ref_logprobs` for the KL terms.

No optimizer and no gradients; with `reference.param_offload` its parameters wait in host memory between
uses. With LoRA the actor serves the reference itself (adapters disabled) and this role is not started.
"""

from __future__ import annotations

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.model import Dtype
from quartet.config.roles import ReferenceConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.roles.run_values import RunValues

__all__ = ["Reference"]


class Reference:
    """The frozen initial policy on one rank."""

    def __init__(
        self, cfg: ReferenceConfig, run: RunValues, mixed_precision: Dtype, routing_replay: bool = False
    ) -> None:
        """`mixed_precision` is the actor's (`actor.mixed_precision`): the KL compares the same numerics;
        `routing_replay` too (`actor.routing_replay=rollout`): the reference routes as the engine did."""
        self.rc = cfg
        self.engine = TrainingEngine(
            EngineSpec(
                run.model_path,
                ModelKind.CAUSAL_LM,
                mixed_precision=mixed_precision,
                optim=None,
                param_offload=cfg.param_offload,
                seed=run.seed,
                remove_padding=run.remove_padding,
                sequence_parallel_size=run.sequence_parallel_size,
                tensor_parallel_size=run.tensor_parallel_size,
                expert_parallel_size=run.expert_parallel_size,  # the frozen copy is split as the actor
                fused_head=run.fused_head,
                routing_replay=routing_replay,
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
