"""A mixture-of-experts model in the training engine: the router's losses and metrics against a plain
transformers forward/backward over each row without padding, padded and packed, with gradient
checkpointing; a value head on the MoE trunk; the trained experts reach the built-in rollout engine; LoRA on
the experts (peft's adapters on 3-D parameters) counted by the planner, synced and exported merged."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_cases import make_batch, pg_loss, unpadded_rows
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from quartet.config.model import Dtype, LoraConfig
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch
from quartet.core.router import router_metrics
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs, TrainingEngine
from quartet.models.loading import load_causal_lm

PROMPTS = [5, 2, 7, 1, 4, 6]
RESPONSES = [3, 6, 1, 4, 2, 5]
AUX, Z = 0.5, 0.1
OPTIM = OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=0.0)


def _zero_loss(out: ModelOutputs, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
    """No policy term: the step's loss and gradient are the router's alone."""
    values = out.logprobs if out.logprobs is not None else out.values
    assert values is not None
    return (values * 0.0).sum(), {}


def _engine(path: Path, kind: ModelKind = ModelKind.CAUSAL_LM, **kw: Any) -> TrainingEngine:
    spec = EngineSpec(
        str(path), kind, Dtype.FLOAT32, optim=OPTIM, moe_aux_loss_coef=AUX, moe_z_loss_coef=Z, **kw
    )
    return TrainingEngine(spec)


def _reference(path: Path, batch: Batch, groups: list[list[int]]) -> dict[str, float]:
    """Plain transformers, one unpadded row at a time: per group of rows (a micro-batch) transformers'
    `load_balancing_loss_func` over the group's tokens and the z-loss, weighted by the group's share of all
    tokens; backward; the gradient norm and the metrics averaged over groups."""
    model = load_causal_lm(path)
    rows = list(unpadded_rows(batch))
    total_tokens = sum(len(ids) for ids, _, _ in rows)
    loss = torch.zeros(())
    aux_values, z_values, entropies = [], [], []
    for group in groups:
        per_layer: list[list[torch.Tensor]] = []
        for i in group:
            ids = rows[i][0]
            out = model(ids[None], output_router_logits=True)
            per_layer.append(list(out.router_logits))
        layers = [torch.cat(parts) for parts in zip(*per_layer, strict=True)]
        aux = load_balancing_loss_func(tuple(layers), num_experts=4, top_k=2)
        z = torch.stack([torch.logsumexp(t, dim=-1).square().mean() for t in layers]).mean()
        share = layers[0].shape[0] / total_tokens
        loss = loss + share * (AUX * aux + Z * z)
        aux_values.append(float(aux.detach()))
        z_values.append(float(z.detach()))
        entropies.append(router_metrics(layers, 2)["router_entropy"])
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), math.inf)
    return {
        "loss": float(loss.detach()),
        "grad_norm": float(norm),
        "moe/aux_loss": sum(aux_values) / len(groups),
        "moe/z_loss": sum(z_values) / len(groups),
        "moe/router_entropy": sum(entropies) / len(groups),
    }


@pytest.mark.parametrize(
    ("size", "packed", "checkpointing"),
    [(100, False, False), (100, True, False), (4, False, False), (4, True, True)],
)
def test_router_terms_equal_plain_transformers(
    moe_model_dir: Path, size: int, packed: bool, checkpointing: bool
) -> None:
    batch = make_batch(PROMPTS, RESPONSES)  # padded both sides with junk tokens: must not count
    engine = _engine(moe_model_dir, remove_padding=packed, gradient_checkpointing=checkpointing)
    got = engine.train_step(batch, _zero_loss, MicroSpec(size=size))
    rows = list(range(len(PROMPTS)))
    want = _reference(moe_model_dir, batch, [rows[i : i + size] for i in range(0, len(rows), size)])
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
    assert got["grad_norm"] > 0
    assert 1.0 <= got["moe/load_imbalance_mean"] <= got["moe/load_imbalance_max"] <= 2.0  # 4 experts, k=2


def test_zero_coefficients_log_the_metrics_and_add_nothing(moe_model_dir: Path) -> None:
    spec = EngineSpec(str(moe_model_dir), optim=OPTIM, mixed_precision=Dtype.FLOAT32, moe_aux_loss_coef=0.0)
    got = TrainingEngine(spec).train_step(make_batch(PROMPTS, RESPONSES), _zero_loss, MicroSpec(size=100))
    assert got["loss"] == 0.0 and got["grad_norm"] == 0.0
    assert got["moe/aux_loss"] > 0 and got["moe/z_loss"] > 0


def test_none_takes_the_model_configs_coefficient(moe_model_dir: Path) -> None:
    spec = EngineSpec(str(moe_model_dir), optim=OPTIM, mixed_precision=Dtype.FLOAT32)
    engine = TrainingEngine(spec)
    assert engine._router is not None
    assert engine._router.aux_coef == load_causal_lm(moe_model_dir).config.router_aux_loss_coef > 0
    got = engine.train_step(make_batch(PROMPTS, RESPONSES), _zero_loss, MicroSpec(size=100))
    assert got["loss"] == pytest.approx(engine._router.aux_coef * got["moe/aux_loss"], rel=1e-6)


def test_a_dense_model_has_no_router_terms(tiny_model_dir: Path) -> None:
    got = _engine(tiny_model_dir).train_step(make_batch(PROMPTS, RESPONSES), _zero_loss, MicroSpec(size=100))
    assert not [k for k in got if k.startswith("moe/")]
    assert got["loss"] == 0.0


def test_a_value_head_on_the_moe_trunk_trains_with_the_router_terms(
    moe_model_dir: Path, tmp_path: Path
) -> None:
    from quartet.models.tiny import save_value_model

    folder = save_value_model(moe_model_dir, tmp_path / "value")
    engine = _engine(folder, ModelKind.VALUE)
    assert type(engine.module).__name__ == "Qwen3MoeForTokenClassification"
    batch = make_batch(PROMPTS, RESPONSES)
    values = engine.forward_values(batch, MicroSpec(size=3))
    assert values.shape == batch["responses"].shape
    got = engine.train_step(batch, _zero_loss, MicroSpec(size=100))
    assert got["moe/aux_loss"] > 0 and got["grad_norm"] > 0


@pytest.mark.parametrize(
    "targets",
    [
        LoraConfig().target_modules,  # q/k/v/o and gate/up/down_proj: attention and every expert
        ("q_proj", "v_proj"),  # attention only
        ("down_proj", "gate"),  # the experts' down_proj and the router
    ],
    ids=["default", "attention", "down_and_router"],
)
def test_lora_adapters_on_experts_are_what_the_planner_counts(
    moe_model_dir: Path, targets: tuple[str, ...]
) -> None:
    """peft turns the dense MLP's names into adapters on the fused 3-D expert weights (one low-rank pair
    per expert) and `gate` into one on the router; the planner counts the same parameters."""
    from quartet.planning.model_shape import shape_from_path

    lora = LoraConfig(rank=4, target_modules=targets)
    engine = _engine(moe_model_dir, lora=lora)
    trainable = {n: p.numel() for n, p in engine.module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert sum(trainable.values()) == shape_from_path(moe_model_dir).lora_params(lora)
    on_experts = any(".mlp.experts." in n for n in trainable)
    assert on_experts == ("down_proj" in targets)


def test_lora_on_experts_syncs_and_exports_merged(moe_model_dir: Path, tmp_path: Path) -> None:
    """After an update the adapters of attention and experts are merged into the weights the rollout engine
    gets, as peft's own merge (the export) gives them, and the base model is the reference."""
    from quartet.engines.weight_export import inference_weights

    engine = _engine(moe_model_dir, lora=LoraConfig(rank=4, alpha=8))
    batch = make_batch(PROMPTS, RESPONSES)
    with engine.adapters_disabled():
        base, _ = engine.forward_logprobs(batch, 1.0, MicroSpec(size=100))
    engine.optimizer.param_groups[0]["lr"] = 0.05  # type: ignore[union-attr]  # adapters move visibly
    engine.train_step(batch, pg_loss, MicroSpec(size=100))
    synced = dict(inference_weights(engine.module))
    exported = load_causal_lm(engine.export_hf(tmp_path / "hf")).state_dict()  # type: ignore[arg-type]
    original = dict(load_causal_lm(moe_model_dir).named_parameters())  # the tied head once, as synced
    assert set(synced) == set(original)
    name = "model.layers.1.mlp.experts.gate_up_proj"
    assert float((synced[name] - original[name]).abs().max()) > 1e-4  # the experts' adapters merged
    for key, value in synced.items():
        torch.testing.assert_close(value, exported[key], atol=1e-6, rtol=1e-5, msg=key)
    plain = TrainingEngine(EngineSpec(str(moe_model_dir), mixed_precision=Dtype.FLOAT32))
    want, _ = plain.forward_logprobs(batch, 1.0, MicroSpec(size=100))
    torch.testing.assert_close(base, want)  # adapters off: the base model


def test_weight_sync_carries_the_trained_experts_to_the_built_in_engine(moe_model_dir: Path) -> None:
    from quartet.engines.hf_modules import hf_model
    from quartet.engines.weight_export import inference_weights
    from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine

    engine = _engine(moe_model_dir)
    before = load_causal_lm(moe_model_dir).state_dict()
    engine.optimizer.param_groups[0]["lr"] = 0.05  # type: ignore[union-attr]  # a visible change
    engine.train_step(make_batch(PROMPTS, RESPONSES), pg_loss, MicroSpec(size=100))
    trained = hf_model(engine.module)
    name = "model.layers.0.mlp.experts.gate_up_proj"
    assert float((trained.state_dict()[name] - before[name]).abs().max()) > 1e-3
    prompt = [7, 11, 13, 17, 19]
    greedy = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    with TorchRolloutEngine(load_causal_lm(moe_model_dir)) as rollout:
        rollout.load_weights(inference_weights(engine.module))
        (out,) = rollout.generate([GenerationRequest(tuple(prompt), greedy)])[0]
    ids = torch.tensor([prompt + list(out.token_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(trained(ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
    assert list(out.token_ids) == logp.argmax(-1).tolist()  # greedy under the trained model
    assert out.logprobs is not None
    want = logp.gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(out.logprobs), want, atol=1e-4, rtol=0)
