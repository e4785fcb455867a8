"""The SFT worker role: a causal LM engine with an optimizer, one optimizer step per call.

    worker = SFTWorker(cfg, model_path, total_steps=300)     # one per rank, inside a host
    metrics = worker.train_batch(batch)                     # loss, grad_norm, lr, tokens
    stats = worker.eval_loss(batch)                          # nll_sum, tokens (sum over ranks on the driver)

The loss is the token-mean negative log-likelihood of the assistant-written tokens of the whole global
batch (all micro-batches, all ranks):

    L = - sum_{i,t} m[i,t] log p(y[i,t] | y[i,<t]) / N_tok,    N_tok = sum_{i,t} m[i,t]

each micro-batch contributing its share through the engine's global `LossScale` (see `core.loss_agg`), so
the gradient is that of one big batch whatever the micro-batching and the number of ranks.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.model import LoraConfig
from quartet.config.root import QuartetConfig
from quartet.core.batch import Batch
from quartet.core.choices import LossAggMode
from quartet.core.loss_agg import aggregate_loss
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs, TrainingEngine
from quartet.roles.engine_role import EngineRole

__all__ = ["SFTWorker", "sft_loss"]


def sft_loss(
    out: ModelOutputs, mb: Batch, scale: LossScale
) -> tuple[torch.Tensor, Mapping[str, torch.Tensor | float]]:
    """This micro-batch's share of the global token-mean NLL of assistant tokens (`response_mask`)."""
    if out.logprobs is None:
        raise ValueError("sft_loss needs log-probs (a causal LM engine)")
    mask = mb["response_mask"].to(out.logprobs.device)
    loss = aggregate_loss(-out.logprobs, mask, LossAggMode.TOKEN_MEAN, global_token_count=scale.tokens)
    return loss, {"tokens": float(scale.tokens), "sequences": float(scale.sequences)}


class SFTWorker(EngineRole):
    """One rank of supervised fine-tuning: optimizer steps, validation loss, checkpoints, export."""

    def __init__(self, cfg: QuartetConfig, model_path: str, total_steps: int = 0) -> None:
        sft = cfg.sft
        lora: LoraConfig | None = cfg.model.lora if cfg.model.lora.rank > 0 else None
        self.engine = TrainingEngine(
            EngineSpec(
                model_path,
                ModelKind.CAUSAL_LM,
                mixed_precision=sft.mixed_precision,
                optim=sft.optim,
                total_steps=total_steps,
                gradient_checkpointing=cfg.model.gradient_checkpointing,
                remove_padding=cfg.model.remove_padding,
                shared_prompts=cfg.model.shared_prompts,
                sequence_parallel_size=cfg.model.sequence_parallel_size,
                tensor_parallel_size=cfg.model.tensor_parallel_size,
                expert_parallel_size=cfg.model.expert_parallel_size,
                fused_head=cfg.model.fused_head,
                lora=lora,
                seed=sft.seed,
            )
        )
        self.micro = MicroSpec(size=sft.micro_batch_size_per_device)

    @dispatch(Split.BY_DP_RANK)
    def train_batch(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on this rank's rows of the global batch.

        Returns `loss` (the global batch's token-mean NLL), `grad_norm` (before clipping), `lr` (of this
        step), `tokens` (trained tokens of the global batch), `sequences`, `skipped_steps`, `micro_batches`.
        """
        return self.engine.train_step(batch, sft_loss, self.micro, temperature=1.0)

    @dispatch(Split.BY_DP_RANK)
    def eval_loss(self, batch: Batch) -> dict[str, float]:
        """Summed NLL of this rank's assistant tokens and their count (the driver sums over ranks)."""
        logprobs, _ = self.engine.forward_logprobs(batch, 1.0, self.micro)
        mask = batch["response_mask"] != 0
        nll = -torch.where(mask, logprobs, torch.zeros((), dtype=logprobs.dtype)).sum()
        return {"nll_sum": float(nll), "tokens": float(mask.sum())}
