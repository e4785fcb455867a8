"""The critic: a value model V(s_t) for GAE, trained with the clipped value loss.

    values = critic.compute_values(batch)        # `values` [B, R]: V of the state before response token t
    metrics = critic.update(batch)               # needs `values` (old), `returns`, `response_mask`

It starts from `critic.model_path`, or from the policy's folder with a fresh value head (transformers'
token-classification head with one label). With `critic.sequence_parallel_size` > 1 its engine splits each
micro-batch by tokens over a sequence group and gathers the per-token values (`engines.packed_run`); the
rows still reach the ranks as with data parallelism only, so nothing here changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.roles import CriticConfig
from quartet.core.batch import Batch
from quartet.core.value_loss import compute_value_loss
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs
from quartet.roles.engine_role import EngineRole
from quartet.roles.run_values import RunValues
from quartet.roles.updates import mean_metrics, mini_batches, optimizer_steps, train_micro_spec

__all__ = ["Critic"]


class Critic(EngineRole):
    """The value model on one rank."""

    def __init__(self, cfg: CriticConfig, run: RunValues) -> None:
        from quartet.engines import TrainingEngine  # the host's import, not the driver's (it reads @dispatch)

        self.cc = cfg
        self.run = run
        self.engine = TrainingEngine(
            EngineSpec(
                cfg.model_path or run.model_path,
                ModelKind.VALUE,
                mixed_precision=cfg.mixed_precision,
                optim=cfg.optim,
                total_steps=optimizer_steps(run, cfg),
                gradient_checkpointing=run.gradient_checkpointing,
                param_offload=cfg.param_offload,
                optimizer_offload=cfg.optimizer_offload,
                seed=run.seed,
                sequence_parallel_size=cfg.sequence_parallel_size,  # packed and split by tokens when > 1
                freeze_vision_tower=run.freeze_vision_tower,  # a VLM critic, as the actor
                moe_aux_loss_coef=cfg.moe_aux_loss_coef,  # MoE models only (`engines.router`)
                moe_z_loss_coef=cfg.moe_z_loss_coef,
            )
        )
        self.norm_constant = float(run.max_response_length)
        self.generator = torch.Generator().manual_seed(run.seed + 1)

    def role_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_role_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    def fresh_streams(self, seed: int) -> None:
        self.generator.manual_seed(seed + 1)  # as at the start: the actor's + 1

    @dispatch(Split.BY_DP_RANK)
    def compute_values(self, batch: Batch) -> Batch:
        """`values` [B, R] (0 past each response's end)."""
        values = self.engine.forward_values(batch, MicroSpec.from_config(self.cc.values))
        return Batch({"values": values}, meta=batch.meta)

    @dispatch(Split.BY_DP_RANK)
    def update(self, batch: Batch) -> dict[str, float]:
        """`critic.epochs` passes over this rank's rows in mini-batches; the mean metrics of the steps."""
        per_rank = self.cc.mini_batch_size * self.run.responses_per_prompt // self.engine.ctx.world
        micro = train_micro_spec(self.cc)
        steps = [
            self.engine.train_step(mini, self._loss, micro)
            for _ in range(self.cc.epochs)
            for mini in mini_batches(batch, per_rank, True, self.generator)
        ]
        metrics = mean_metrics(steps)  # an MoE trunk's router metrics too: critic/moe/*
        return {f"critic/{k}" if "/" not in k or k.startswith("moe/") else k: v for k, v in metrics.items()}

    def _loss(
        self, out: ModelOutputs, mb: Batch, scale: LossScale
    ) -> tuple[torch.Tensor, Mapping[str, torch.Tensor | float]]:
        assert out.values is not None
        result = compute_value_loss(
            out.values,
            mb["values"],
            mb["returns"],
            mb["response_mask"],
            self.cc.cliprange_value,
            agg_mode=self.cc.loss_agg_mode,
            global_token_count=scale.tokens,
            global_seq_count=scale.sequences,
            norm_constant=self.norm_constant,
        )
        return result.loss, result.metrics
