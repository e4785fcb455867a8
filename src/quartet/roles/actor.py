"""The actor: the policy being trained. Old log-probs before the update, then PPO-style updates.

    actor = Actor(cfg.actor, run, lora=cfg.model.lora)     # one per rank, inside a colocated host
    batch = batch.union(actor.compute_logprobs(batch))     # old_logprobs [B, R]
    metrics = actor.update(batch)                          # epochs x mini-batches of optimizer steps

The update loss of one micro-batch (every term aggregated with the counts of the whole mini-batch, so
gradient accumulation and data parallelism give the gradient of one big batch):

    loss = policy_loss(logp, old_logp, advantages)          # PPO / GSPO / REINFORCE, clip, TIS
         + kl_loss_coef * KL(logp || ref_logp)              # with actor.use_kl_loss
         + gkd_coef * JSD_beta(teacher || student)         # GKD over the teacher's top-k (`core.gkd`)
         - entropy_coeff * entropy                          # with actor.entropy_coeff > 0
         + moe_aux_loss_coef * aux + moe_z_loss_coef * z    # MoE policies: the router's terms, which the
                                                            # engine adds with the moe/* metrics (`router`)

With LoRA, the same model with adapters disabled is the reference policy (`compute_ref_logprobs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import torch

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.model import LoraConfig
from quartet.config.roles import ActorConfig, MicroBatching, RoutingReplay
from quartet.config.rollout import WeightTransport
from quartet.core.batch import Batch
from quartet.core.choices import LossAggMode, TISMode
from quartet.core.entropy import entropy_bonus
from quartet.core.gkd import TEACHER_TOPK_IDS, TEACHER_TOPK_LOGPROBS, gkd_loss_term
from quartet.core.kl import kl_loss_term
from quartet.core.metrics import logprob_diff_metrics
from quartet.core.policy_loss import ClipParams, compute_policy_loss
from quartet.core.registry import import_custom_module
from quartet.core.routing import ROUTING_MISMATCH
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs
from quartet.roles.engine_role import EngineRole
from quartet.roles.run_values import RunValues
from quartet.roles.updates import mean_metrics, mini_batches, optimizer_steps, train_micro_spec
from quartet.roles.weight_stream import WeightPublisher

__all__ = ["Actor"]


class _Aggregation(TypedDict):
    """How every loss term of a micro-batch is reduced (the same for all terms)."""

    agg_mode: LossAggMode
    global_token_count: int
    global_seq_count: int
    norm_constant: float


class Actor(EngineRole):
    """The policy on one rank: log-probs, updates, checkpoints, export."""

    def __init__(
        self,
        cfg: ActorConfig,
        run: RunValues,
        lora: LoraConfig | None = None,
        ref_logprobs: MicroBatching | None = None,
    ) -> None:
        """`lora` (model.lora; rank 0 is none) adapts the policy; `ref_logprobs` (reference.logprobs) is the
        micro-batching of `compute_ref_logprobs`, which only a LoRA actor serves."""
        from quartet.engines import TrainingEngine  # the host's import, not the driver's (it reads @dispatch)

        import_custom_module(run.custom_module)  # its registered losses, in this process too
        self.ac = cfg
        self.run = run
        self.ref_micro = ref_logprobs or MicroBatching()
        self.engine = TrainingEngine(
            EngineSpec(
                run.model_path,
                ModelKind.CAUSAL_LM,
                mixed_precision=cfg.mixed_precision,
                optim=cfg.optim,
                total_steps=optimizer_steps(run, cfg),
                gradient_checkpointing=run.gradient_checkpointing,
                lora=lora if lora is not None and lora.rank > 0 else None,
                param_offload=cfg.param_offload,
                optimizer_offload=cfg.optimizer_offload,
                seed=run.seed,
                remove_padding=run.remove_padding,
                shared_prompts=run.shared_prompts,
                sequence_parallel_size=run.sequence_parallel_size,
                tensor_parallel_size=run.tensor_parallel_size,
                expert_parallel_size=run.expert_parallel_size,
                fused_head=run.fused_head,
                freeze_vision_tower=run.freeze_vision_tower,
                routing_replay=cfg.routing_replay is RoutingReplay.ROLLOUT,
                moe_aux_loss_coef=cfg.moe_aux_loss_coef,  # MoE models only (`engines.router`)
                moe_z_loss_coef=cfg.moe_z_loss_coef,
            )
        )
        self.clip = ClipParams(cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.dual_clip_c)
        self.norm_constant = float(cfg.loss_agg_norm_constant or run.max_response_length)
        self.generator = torch.Generator().manual_seed(run.seed)
        self.updates = 0
        self.publisher = WeightPublisher()

    def role_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "updates": self.updates}

    def load_role_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.updates = int(state["updates"])

    def fresh_streams(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    # ---- weights to rollout replicas on a pool of their own (quartet.roles.weight_stream) ---------------

    @dispatch(Split.BROADCAST)
    def open_weight_stream(
        self, receivers: int, bucket_bytes: int, timeout_s: float
    ) -> tuple[str, int] | None:
        """Rank 0 opens the weight-sync group for `receivers` replicas: its (address, port); others None."""
        return self.publisher.open(receivers, bucket_bytes, timeout_s)

    @dispatch(Split.BROADCAST)
    def accept_weight_stream(
        self, transport: WeightTransport = WeightTransport.GLOO, same_node: bool = False
    ) -> None:
        """Rank 0 waits until every replica joined (bounded by the stream's timeout); `transport` is
        `rollout.weight_sync.transport`, `same_node` whether every replica is on rank 0's node."""
        self.publisher.accept(transport, same_node)

    @dispatch(Split.BROADCAST)
    def close_weight_stream(self) -> None:
        """Rank 0 leaves the weight-sync group (a replica died: the driver forms a new one)."""
        self.publisher.close()

    @dispatch(Split.BROADCAST)
    def publish_weights(self, version: int) -> dict[str, float]:
        """Stream the current weights to every replica as `version` (bytes, seconds, buckets on rank 0)."""
        from quartet.engines.weight_export import inference_weights

        engine = self.engine
        was_offloaded = engine.offloaded
        if was_offloaded:
            engine.onload()
        try:
            return self.publisher.publish(inference_weights(engine.module), version)
        finally:
            if was_offloaded:
                engine.offload()

    # ---- no-grad passes ---------------------------------------------------------------------------------

    @dispatch(Split.BY_DP_RANK)
    def compute_logprobs(self, batch: Batch) -> Batch:
        """`old_logprobs` [B, R] (and `entropy` [B, R]) of the responses under the current policy; with the
        engine's MoE routing in the batch (`routed_experts`), `routing_mismatch` [B, R] as well: per response
        token, the share of MoE layers whose own top-k differs from the engine's (`routing_replay`)."""
        micro = MicroSpec.from_config(self.ac.logprobs)
        got = self.engine.forward_policy(
            batch, batch.meta.temperature, micro, with_entropy=True, with_routing_mismatch=True
        )
        assert got.logprobs is not None
        out = {"old_logprobs": got.logprobs}
        if got.entropy is not None:
            out["entropy"] = got.entropy
        if got.routing_mismatch is not None:
            out[ROUTING_MISMATCH] = got.routing_mismatch
        return Batch(out, meta=batch.meta)

    @dispatch(Split.BY_DP_RANK)
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """`ref_logprobs` [B, R] from this model with its LoRA adapters disabled (the base policy)."""
        micro = MicroSpec.from_config(self.ref_micro)
        with self.engine.adapters_disabled():
            logprobs, _ = self.engine.forward_logprobs(batch, batch.meta.temperature, micro)
        return Batch({"ref_logprobs": logprobs}, meta=batch.meta)

    # ---- update -----------------------------------------------------------------------------------------

    @dispatch(Split.BY_DP_RANK)
    def update(self, batch: Batch) -> dict[str, float]:
        """`actor.epochs` passes over this rank's rows in mini-batches; the mean metrics of the steps.

        Needs `responses`, `response_mask`, `attention_mask`, `prompts`, `old_logprobs`, `advantages`;
        `ref_logprobs` with `actor.use_kl_loss`; `rollout_logprobs` with `actor.tis_cap`.
        """
        per_rank = self.ac.mini_batch_size * self.run.responses_per_prompt // self.engine.ctx.world
        micro = train_micro_spec(self.ac)
        on_policy = "old_logprobs" not in batch
        if on_policy and (self.ac.epochs != 1 or len(batch) > per_rank):
            raise ValueError(
                f"the update got no old_logprobs, which only a single optimizer step may do (its own "
                f"log-probs are then the old ones), but it would make {self.ac.epochs} epoch(s) over "
                f"{len(batch)} rows in mini-batches of {per_rank}: compute them first (compute_logprobs)"
            )
        entropy = self.ac.entropy_coeff > 0 or on_policy  # on-policy: the entropy metric comes from here
        steps = []
        for _ in range(self.ac.epochs):
            for mini in mini_batches(batch, per_rank, self.ac.shuffle, self.generator):
                steps.append(
                    self.engine.train_step(
                        mini,
                        self._loss,
                        micro,
                        with_entropy=entropy,
                        entropy_grad=self.ac.entropy_coeff > 0,
                        support_key=TEACHER_TOPK_IDS if self.run.gkd_coef > 0 else None,
                    )
                )
        self.updates += 1
        metrics = mean_metrics(steps)
        return {f"actor/{k}" if "/" not in k else k: v for k, v in metrics.items()}

    def _loss(
        self, out: ModelOutputs, mb: Batch, scale: LossScale
    ) -> tuple[torch.Tensor, Mapping[str, torch.Tensor | float]]:
        assert out.logprobs is not None
        mask = mb["response_mask"]
        agg = _Aggregation(
            agg_mode=self.ac.loss_agg_mode,
            global_token_count=scale.tokens,
            global_seq_count=scale.sequences,
            norm_constant=self.norm_constant,
        )
        metrics: dict[str, torch.Tensor | float] = {}
        if "old_logprobs" in mb:
            old = mb["old_logprobs"]
        else:  # one optimizer step over the batch: the policy before it is this one (ratio exactly 1)
            old = out.logprobs.detach()
            if "rollout_logprobs" in mb:
                metrics |= logprob_diff_metrics(mb["rollout_logprobs"], old, mask)
        pg = compute_policy_loss(
            self.ac.policy_loss,
            out.logprobs,
            old,
            mb["advantages"],
            mask,
            clip=self.clip,
            rollout_logprob=mb["rollout_logprobs"] if self.ac.tis_cap > 0 else None,
            tis_cap=self.ac.tis_cap,
            tis_mask_low=self.ac.tis_mask_low if self.ac.tis_mode is TISMode.MASK else None,
            **agg,
        )
        loss, metrics = pg.loss, metrics | dict(pg.metrics)
        if self.ac.use_kl_loss:
            kl = kl_loss_term(
                out.logprobs, mb["ref_logprobs"], mask, self.ac.kl_loss_type, self.ac.kl_loss_coef, **agg
            )
            loss = loss + kl.loss
            metrics |= kl.metrics
        if self.run.gkd_coef > 0:
            gkd = gkd_loss_term(
                out.required("support_logprobs"),
                mb[TEACHER_TOPK_LOGPROBS],
                mask,
                self.run.gkd_beta,
                self.run.gkd_coef,
                **agg,
            )
            loss = loss + gkd.loss
            metrics |= gkd.metrics
        if out.entropy is not None:  # coefficient 0 (the on-policy update's metric): a zero term, no graph
            bonus = entropy_bonus(out.entropy, mask, self.ac.entropy_coeff, **agg)
            loss = loss + bonus.loss
            metrics |= bonus.metrics
        return loss, metrics
