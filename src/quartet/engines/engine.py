"""`TrainingEngine`: one transformers model on one rank, with forward passes, updates and state handling.

The engine hides sharding, micro-batching, mixed precision and offloading from the roles:

    engine = TrainingEngine(EngineSpec(model_path, ModelKind.CAUSAL_LM, optim=OptimConfig(lr=1e-6)))
    old_logprobs, entropy = engine.forward_logprobs(batch, temperature, MicroSpec(size=8), with_entropy=True)
    metrics = engine.train_step(mini_batch, policy_loss_fn, MicroSpec(max_tokens=8192))

Gradient accumulation. `train_step` computes the counts of the whole mini-batch (valid response tokens and
sequences, summed over ranks) BEFORE any forward, hands them to the loss function of every micro-batch
(`LossScale`), and backpropagates each micro-batch's loss times `ctx.loss_factor` (FSDP2 averages
gradients over ranks: the world size, or dp under tensor parallelism; see `dist`). When the loss function
divides by those global counts, the accumulated gradient equals the gradient of one big batch holding
every rank's rows, whatever the micro-batching.

Mixed precision. Weights (and AdamW states) are float32; forward and backward run under
`torch.autocast(device, bfloat16)` when `spec.mixed_precision` is bfloat16, on CPU too. Log-probs, entropy
and values are computed from the model outputs in float32 outside autocast.

Non-finite gradients. If the global gradient norm is inf or NaN the optimizer step is skipped, gradients
are dropped and `skipped_steps` counts it; the scheduler still advances, so the learning rate stays tied
to the trainer's step count (as in verl).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quartet.config.model import Dtype
from quartet.core.batch import Batch
from quartet.engines import checkpoint, heads
from quartet.engines.build import build_module
from quartet.engines.dist import DistContext, all_reduce_max, init_distributed, sum_over_dp
from quartet.engines.fused_head import find_lm_head
from quartet.engines.head_outputs import (
    NO_EXTRAS,
    ExtraOutputs,
    ExtrasUnsupported,
    extra_outputs,
    head_request,
    run_head,
)
from quartet.engines.inputs import ModelInputs, build_inputs, pad_responses, valid_lengths
from quartet.engines.loss_scale import loss_scale
from quartet.engines.micro import extend_plan, plan_micro_batches, restore_order
from quartet.engines.model_init import ScoreCapture
from quartet.engines.offload import move_module, move_optimizer_state
from quartet.engines.optim import build_optimizer, build_scheduler, optimizer_step, trainable_parameters
from quartet.engines.packed_run import PackedPlace, packed_logprobs, packed_values
from quartet.engines.router import RouterLoss, routing
from quartet.engines.routing_replay import RoutingReplay, with_mismatch
from quartet.engines.spec import EngineSpec, LossFn, LossScale, MicroSpec, ModelKind, ModelOutputs
from quartet.engines.tensor_parallel import VocabHead, fused_head_allowed, row_group
from quartet.engines.ulysses import group_rows, seq_group
from quartet.engines.vision_inputs import NO_VISION, VisionCall, vision_call
from quartet.models.vision import image_token_mask

__all__ = ["EngineStateError", "TrainingEngine"]

_AUTOCAST = {Dtype.BFLOAT16: torch.bfloat16, Dtype.FLOAT16: torch.float16}


class EngineStateError(RuntimeError):
    """A call that the engine's current state does not allow (frozen, offloaded, no adapters)."""


class TrainingEngine:
    """A transformers model on this rank (FSDP2-sharded when the world has more than one rank).

    Args:
        spec: what to load and how to train it.
        offload_device: where `offload()` puts parameters and optimizer states (host memory by default).
    """

    def __init__(self, spec: EngineSpec, *, offload_device: torch.device | str = "cpu") -> None:
        self.spec = spec
        self.ctx: DistContext = init_distributed(
            sp=spec.sequence_parallel_size, tp=spec.tensor_parallel_size, ep=spec.expert_parallel_size
        )
        self._seq_group = seq_group(self.ctx)
        self._row_group = self._seq_group or row_group(self.ctx)  # ranks that pool their rows (SP or TP)
        self.module: nn.Module = build_module(spec, self.ctx)  # model, then parallelise, then shard
        self._scores = ScoreCapture(self.module) if spec.kind is ModelKind.REWARD else None
        self._vocab = VocabHead.of(self.module, self.ctx)  # TP: logits sharded by vocabulary
        wanted = self.ctx.device.type == "cuda" if spec.fused_head is None else spec.fused_head
        wanted = fused_head_allowed(wanted, self._vocab)  # not under TP (`tensor_parallel`)
        self._lm_head = find_lm_head(self.module) if wanted and spec.kind is ModelKind.CAUSAL_LM else None
        self._routing = RoutingReplay(self.module, spec.routing_replay)  # MoE: replay, mismatch metric
        self._router = RouterLoss.of(self.module, spec, self._seq_group)  # MoE only
        self.optimizer: torch.optim.AdamW | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if spec.optim is not None:
            self.optimizer = build_optimizer(self.module, spec.optim)
            self.scheduler = build_scheduler(self.optimizer, spec.optim, spec.total_steps)
        self.steps = 0
        """Optimizer steps taken (skipped ones included)."""
        self.skipped_steps = 0
        """Steps whose gradient norm was not finite."""
        self.offload_device = torch.device(offload_device)
        self._params_offloaded = False
        self._optimizer_offloaded = False

    # ---- properties -------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """The compute device of this rank."""
        return self.ctx.device

    @property
    def offloaded(self) -> bool:
        """True while parameters or optimizer states sit on `offload_device`."""
        return self._params_offloaded or self._optimizer_offloaded

    # ---- forward passes (no gradient) -------------------------------------------------------------------

    def forward_logprobs(
        self, batch: Batch, temperature: float, micro: MicroSpec, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs [B, R] (float32, on CPU) of `responses`, and their entropy [B, R] if asked.

        Log-probs are under softmax(logits / temperature); positions past a response's end hold 0.
        """
        out = self.forward_policy(batch, temperature, micro, with_entropy=with_entropy)
        return out.required("logprobs"), out.entropy

    def forward_policy(
        self,
        batch: Batch,
        temperature: float,
        micro: MicroSpec,
        *,
        with_entropy: bool = False,
        with_routing_mismatch: bool = False,
        extras: ExtraOutputs = NO_EXTRAS,
    ) -> ModelOutputs:
        """`forward_logprobs` as `ModelOutputs` [B, R] (float32, on CPU), with `routing_mismatch` when asked
        and the batch carries the engine's `routed_experts` (`engines.routing_replay`), and the `extras`
        asked for ([B, R, k]: top-k, support log-probs)."""
        self._need(ModelKind.CAUSAL_LM)
        batch, own = group_rows(batch, self._row_group)  # SP/TP: the rows of the whole group
        run = (temperature, with_entropy, with_routing_mismatch, extras)
        outs, plan = self._no_grad_pass(batch, micro, *run)
        fields = zip(*(o.tensors() for o in outs), strict=True)  # per field, each micro-batch's part
        return ModelOutputs(*(None if f[0] is None else restore_order(list(f), plan)[own] for f in fields))

    def forward_values(self, batch: Batch, micro: MicroSpec) -> torch.Tensor:
        """Values [B, R] (float32, on CPU): value[t] is the estimate of the state BEFORE response token t.

        That is the value head's output at the position whose logits choose token t: positions P-1 .. P+R-2
        of the prompt + response sequence (verl's `values[:, P-1 : P+R-1]`). Positions past the end hold 0.
        """
        self._need(ModelKind.VALUE)
        batch, own = group_rows(batch, self._seq_group)  # with SP: the rows of the whole sequence group
        outs, plan = self._no_grad_pass(batch, micro, 1.0, False)
        return restore_order([o.required("values") for o in outs], plan)[own]

    def forward_scores(self, batch: Batch, micro: MicroSpec) -> torch.Tensor:
        """Reward-model scores [B] (float32, on CPU): the head's output at each row's last attended token."""
        self._need(ModelKind.REWARD)
        self._check_loaded()
        self.module.eval()
        plan = self._plan(batch, micro)
        parts, kept = [], []
        with torch.no_grad():
            for rows in plan:
                mb, dummy = self._micro_batch(batch, rows)
                scores = self._scores_of(build_inputs(mb))
                if not dummy:
                    parts.append(scores.cpu())
                    kept.append(rows)
        return restore_order(parts, kept)

    # ---- training ---------------------------------------------------------------------------------------

    def train_step(
        self,
        batch: Batch,
        loss_fn: LossFn,
        micro: MicroSpec,
        *,
        temperature: float | None = None,
        with_entropy: bool = False,
        entropy_grad: bool = True,
        support_key: str | None = None,
    ) -> dict[str, float]:
        """One optimizer step over this rank's share of a mini-batch, cut into micro-batches.

        Args:
            batch: this rank's rows of the mini-batch (prompts, responses, attention_mask, response_mask and
                whatever columns `loss_fn` reads).
            loss_fn: (outputs, micro-batch, scale) -> (loss, metrics); see `spec.LossFn`. The micro-batch
                holds the rows of `batch` (on the compute device); outputs are [b, R] with graph.
            micro: micro-batching of the forward/backward passes.
            temperature: divides the logits for log-probs; None uses `batch.meta.temperature`.
            with_entropy: also compute `outputs.entropy` (causal LM).
            entropy_grad: False computes the entropy without a graph (for a metric: cheaper, no backward).
            support_key: a column [B, R, k] of token ids: `outputs.support_logprobs` at them (GKD).

        Returns:
            `loss` (the mini-batch loss: micro-batch losses summed over micro-batches and ranks),
            `grad_norm` (before clipping; inf/nan when skipped), `lr` (used by this step), `skipped_steps`
            (so far), `micro_batches`, and the mean over this rank's micro-batches of each `loss_fn` metric.
        """
        optimizer, scheduler = self._require_optimizer()
        self._check_loaded()
        temp = batch.meta.temperature if temperature is None else temperature
        self.module.train()
        batch, _ = group_rows(batch, self._row_group)
        plan = self._plan(batch, micro)
        scale = loss_scale(batch, self.ctx)
        optimizer.zero_grad(set_to_none=True)
        # Sums stay on the device: no host sync per micro-batch.
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        collected: dict[str, list[torch.Tensor]] = {}
        for rows in plan:
            mb, dummy = self._micro_batch(batch, rows)
            run = (temp, with_entropy, entropy_grad, ExtraOutputs(support_key=support_key))
            loss, metrics = self._micro_step(mb.to(self.device), dummy, loss_fn, scale, run)
            loss_sum += loss.double()
            for key, value in metrics.items():
                metric = torch.as_tensor(value, dtype=torch.float64, device=self.device)
                collected.setdefault(key, []).append(metric)
        result = self._optimizer_step(optimizer, scheduler)
        result["loss"] = sum_over_dp(float(loss_sum), self.ctx)
        result["micro_batches"] = float(len(plan))
        result.update({k: float(torch.stack(v).mean()) for k, v in collected.items()})
        return result

    def _micro_step(
        self,
        mb: Batch,
        dummy: bool,
        loss_fn: LossFn,
        scale: LossScale,
        run: tuple[float, bool, bool, ExtraOutputs],
    ) -> tuple[torch.Tensor, Mapping[str, torch.Tensor | float]]:
        """One micro-batch's forward and backward: its loss (detached) and metrics. A stand-in micro-batch
        (`dummy`) keeps this rank in step with the others' collectives and adds 0 and no metrics."""
        inputs = build_inputs(mb)
        metrics: Mapping[str, torch.Tensor | float] = {}
        with self._routing.pass_(inputs, self.spec.packs, self.device):  # backward too: checkpointing
            with routing(self._router, inputs, self.spec.packs) as routed:
                outputs = self._run(mb, inputs, *run)
            if dummy:
                loss = outputs.zero_loss(self.device)
            else:
                loss, metrics = loss_fn(outputs, mb, scale)
                if self._router is not None:  # MoE: the router's losses and metrics (`engines.router`)
                    loss, metrics = self._router.add(loss, metrics, routed, scale)
            torch.autograd.backward(loss * self.ctx.loss_factor)
        return loss.detach(), metrics

    def _optimizer_step(
        self, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR
    ) -> dict[str, float]:
        assert self.spec.optim is not None
        params = trainable_parameters(self.module)
        several_meshes = self.ctx.tp > 1 or self.ctx.ep > 1  # DTensors on two meshes: norms per placement
        grad_norm, lr = optimizer_step(
            params, optimizer, scheduler, self.spec.optim.grad_clip, several_meshes
        )
        self.skipped_steps += int(not math.isfinite(grad_norm))
        self.steps += 1
        return {"grad_norm": grad_norm, "lr": lr, "skipped_steps": float(self.skipped_steps)}

    # ---- adapters, offload ------------------------------------------------------------------------------

    @contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Inside the block the LoRA adapters are off: forward passes give the base (reference) model."""
        if not self.spec.uses_lora:
            raise EngineStateError("adapters_disabled() needs an engine with LoRA adapters (lora.rank > 0)")
        with self.module.disable_adapter():  # type: ignore[operator]
            yield

    def offload(self, *, force: bool = False) -> None:
        """Move parameters (`spec.param_offload`) and optimizer states (`spec.optimizer_offload`) to
        `offload_device`. Skipped when that is the compute device itself (CPU training), unless `force`."""
        if self.offload_device == self.device and not force:
            return
        if self.spec.param_offload and not self._params_offloaded:
            move_module(self.module, self.offload_device)
            self._params_offloaded = True
        if self.spec.optimizer_offload and self.optimizer is not None and not self._optimizer_offloaded:
            move_optimizer_state(self.optimizer, self.offload_device)
            self._optimizer_offloaded = True

    def onload(self) -> None:
        """Bring back to the compute device whatever `offload()` moved."""
        if self._params_offloaded:
            move_module(self.module, self.device)
            self._params_offloaded = False
        if self._optimizer_offloaded and self.optimizer is not None:
            move_optimizer_state(self.optimizer, self.device)
            self._optimizer_offloaded = False

    # ---- state ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: model, optimizer (once it has stepped), scheduler, RNG, counters.

        Model and optimizer tensors are references to live storage (sharded DTensors with FSDP2); clone them
        to keep a copy.
        """
        self._check_loaded()
        return checkpoint.snapshot(self.module, self.optimizer, self.scheduler, self._counters(), self.device)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict()` of an engine with the same spec and world size."""
        self._check_loaded()
        counters = checkpoint.restore_state(state, self.module, self.optimizer, self.scheduler, self.device)
        self._set_counters(counters)

    def save(self, folder: str | Path) -> None:
        """Write this rank's part of a checkpoint to `folder` (every rank calls it with the same folder)."""
        self._check_loaded()
        checkpoint.save_checkpoint(
            folder, self.module, self.optimizer, self.scheduler, self._counters(), self.ctx
        )

    def load(self, folder: str | Path) -> None:
        """Load a checkpoint written by `save` (model and optimizer may come from another world size)."""
        self._check_loaded()
        counters = checkpoint.load_checkpoint(
            folder, self.module, self.optimizer, self.scheduler, self.ctx, self.spec.seed
        )
        self._set_counters(counters)

    def export_hf(self, folder: str | Path, dtype: torch.dtype = torch.float32) -> Path | None:
        """Consolidated transformers folder (LoRA merged, tokenizer copied); all ranks call, rank 0 writes."""
        self._check_loaded()
        return checkpoint.export_hf(folder, self.module, self.spec, self.ctx, dtype)

    def _counters(self) -> dict[str, int]:
        return {"steps": self.steps, "skipped_steps": self.skipped_steps}

    def _set_counters(self, counters: dict[str, int]) -> None:
        self.steps = counters["steps"]
        self.skipped_steps = counters["skipped_steps"]

    # ---- internals --------------------------------------------------------------------------------------

    @property
    def fused_head(self) -> bool:
        """True when log-probs and entropy come from the fused head (`quartet.engines.fused_head`)."""
        return self._lm_head is not None

    def _need(self, kind: ModelKind) -> None:
        if self.spec.kind is not kind:
            raise EngineStateError(f"this engine holds a {self.spec.kind} model; the call needs {kind}")

    def _check_loaded(self) -> None:
        if self.offloaded:
            raise EngineStateError("the engine is offloaded; call onload() first")

    def _require_optimizer(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        if self.optimizer is None or self.scheduler is None:
            raise EngineStateError("train_step on a frozen engine (EngineSpec.optim is None)")
        return self.optimizer, self.scheduler

    def _autocast(self) -> Any:
        dtype = _AUTOCAST.get(Dtype(self.spec.mixed_precision))
        if dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _plan(self, batch: Batch, micro: MicroSpec) -> list[torch.Tensor]:
        """Micro-batches of `batch`, as many on every rank (see `micro.extend_plan`)."""
        if len(batch) == 0:
            raise ValueError("an engine pass needs at least one row on every rank")
        plan = plan_micro_batches(valid_lengths(batch), micro)
        return extend_plan(plan, all_reduce_max(len(plan), self.ctx))

    @staticmethod
    def _micro_batch(batch: Batch, rows: torch.Tensor) -> tuple[Batch, bool]:
        """The rows of one micro-batch; an empty one is stood in for by row 0 (flagged as a dummy)."""
        if rows.numel():
            return batch.index(rows), False
        return batch.index(0), True

    def _no_grad_pass(
        self,
        batch: Batch,
        micro: MicroSpec,
        temperature: float,
        with_entropy: bool,
        mismatch: bool = False,
        extras: ExtraOutputs = NO_EXTRAS,
    ) -> tuple[list[ModelOutputs], list[torch.Tensor]]:
        self._check_loaded()
        self.module.eval()
        plan = self._plan(batch, micro)
        outs, kept = [], []
        with torch.no_grad():
            for rows in plan:
                mb, dummy = self._micro_batch(batch, rows)
                inputs = build_inputs(mb)
                with self._routing.pass_(inputs, self.spec.packs, self.device, record=mismatch) as capture:
                    out = self._run(mb, inputs, temperature, with_entropy, extras=extras)
                    out = with_mismatch(out, capture, inputs)
                if not dummy:
                    outs.append(ModelOutputs(*(None if t is None else t.cpu() for t in out.tensors())))
                    kept.append(rows)
        return outs, kept

    def _model_call(self, inputs: ModelInputs, vision: VisionCall = NO_VISION, **extra: Any) -> Any:
        """The model on `inputs`; `vision` (`engines.vision_inputs`) adds a VLM's images and positions."""
        kwargs = {"position_ids": inputs.position_ids.to(self.device), **vision[0], **extra}
        with self._autocast(), image_token_mask(vision[1], vision[2]):
            return self.module(
                input_ids=inputs.input_ids.to(self.device),
                attention_mask=inputs.attention_mask.to(self.device),
                use_cache=False,
                **kwargs,
            )

    def _run(
        self,
        mb: Batch,
        inputs: ModelInputs,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = True,
        extras: ExtraOutputs = NO_EXTRAS,
    ) -> ModelOutputs:
        """Outputs [b, R] of one micro-batch (graph attached when grad is enabled)."""
        width, full = inputs.response_width, mb["responses"].shape[1]
        valid = inputs.response_mask.to(self.device)
        vision = vision_call(self.module, mb, inputs, self.device, self.ctx.sharded)

        def finish(t: torch.Tensor) -> torch.Tensor:
            return pad_responses(torch.where(valid, t, torch.zeros((), device=t.device)), full)

        if self.spec.kind is ModelKind.VALUE:
            if self.spec.packs:  # split by tokens under SP (`engines.packed_run`)
                values = packed_values(self.module, inputs, self._packed_place(vision), vision)
                return ModelOutputs(values=finish(values))
            token_values = self._model_call(inputs, vision).logits.squeeze(-1)
            return ModelOutputs(values=finish(heads.response_values(token_values, width)))
        if self.spec.kind is not ModelKind.CAUSAL_LM:
            raise EngineStateError(f"no per-token outputs for a {self.spec.kind} model")
        if self.spec.packs:
            if extras.wanted:
                raise ExtrasUnsupported(
                    "top-k and support log-probs (GKD) are not built for packed passes "
                    "(model.remove_padding or model.sequence_parallel_size > 1)"
                )
            logprobs, entropy = packed_logprobs(
                self.module,
                inputs,
                self._packed_place(vision),
                (temperature, with_entropy, entropy_grad),
                vision,
            )
            return ModelOutputs(
                logprobs=finish(logprobs), entropy=None if entropy is None else finish(entropy)
            )
        # Only the positions that predict response tokens reach the head: P-1 .. P+R'-2 (see `heads`).
        t = inputs.input_ids.shape[1]
        targets = inputs.input_ids[:, t - width :].to(self.device)

        def logits(fused: bool) -> torch.Tensor:
            if fused:  # exactly those positions
                keep = torch.arange(t - width - 1, t - 1, device=self.device)
                return self._model_call(inputs, vision, logits_to_keep=keep).logits  # type: ignore[no-any-return]
            return self._model_call(inputs, vision, logits_to_keep=width + 1).logits[:, :-1]  # type: ignore[no-any-return]

        request = head_request(mb, targets, temperature, (with_entropy, entropy_grad), extras)
        logprobs, entropy = run_head(logits, request, self._lm_head, self._vocab)
        return ModelOutputs(
            logprobs=finish(logprobs),
            entropy=None if entropy is None else finish(entropy),
            **extra_outputs(request, valid, full),
        )

    def _packed_place(self, vision: VisionCall) -> PackedPlace:
        """Where packed passes run; rows with one prompt run it once for text-only dense models without SP."""
        dense = self._router is None and not self._routing.routers
        share = self.spec.shared_prompts and self._seq_group is None and not vision[0] and dense
        return PackedPlace(self._seq_group, self.device, self._autocast, self._lm_head, self._vocab, share)

    def _scores_of(self, inputs: ModelInputs) -> torch.Tensor:
        assert self._scores is not None
        with self._scores.capturing() as captured:
            self._model_call(inputs)
        assert captured.output is not None
        per_token = captured.output.squeeze(-1).float()
        last = heads.last_valid_index(inputs.attention_mask).to(self.device)
        return per_token.gather(1, last.unsqueeze(1)).squeeze(1)
