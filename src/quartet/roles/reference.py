"""The reference policy: a frozen copy of the initial policy, giving `ref_logprobs` for the KL terms.

No optimizer and no gradients; with `reference.param_offload` its parameters wait in host memory between
uses. With LoRA the actor serves the reference itself (adapters disabled) and this role is not started.
"""

from __future__ import annotations

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.model import Dtype
from quartet.config.roles import ReferenceConfig
from quartet.core.batch import Batch
from quartet.roles.frozen import FrozenScorer
from quartet.roles.run_values import RunValues

__all__ = ["Reference"]


class Reference(FrozenScorer):
    """The frozen initial policy on one rank."""

    def __init__(
        self, cfg: ReferenceConfig, run: RunValues, mixed_precision: Dtype, routing_replay: bool = False
    ) -> None:
        """`mixed_precision` is the actor's (`actor.mixed_precision`): the KL compares the same numerics;
        `routing_replay` too (`actor.routing_replay=rollout`): the reference routes as the engine did."""
        self.rc = cfg
        super().__init__(
            run.model_path,
            run,
            mixed_precision,
            cfg.logprobs,
            cfg.param_offload,
            expert_parallel_size=run.expert_parallel_size,  # the frozen copy is split as the actor
            fused_head=run.fused_head,
            routing_replay=routing_replay,
        )

    @dispatch(Split.BY_DP_RANK)
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """`ref_logprobs` [B, R] of the responses under the initial policy (same temperature as rollout)."""
        return Batch({"ref_logprobs": self.response_logprobs(batch)}, meta=batch.meta)
