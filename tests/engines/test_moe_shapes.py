"""gpt-oss and DeepSeek-V3 shapes in the training engine, against plain transformers on each unpadded row.

gpt-oss: attention sinks, a sliding-window layer (window 8, rows up to 13 tokens), biased experts, a softmax
router with a bias. DeepSeek-V3: MLA (queries and keys wider than values), a dense first layer, a shared
expert, a sigmoid router with grouped top-k and a score correction bias (drawn at random by the kit, so its
choice is not the top-k of its logits). Log-probs padded and packed; one update's loss, metrics and every
parameter's gradient, with the router's terms, padded, packed and under gradient checkpointing; a value
head on each trunk; a nonzero load-balancing coefficient refused where the model defines no such loss."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_cases import make_batch, pg_loss, reference_logprobs, unpadded_rows
from transformers.models.gpt_oss.modeling_gpt_oss import load_balancing_loss_func

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.hf_modules import hf_model
from quartet.models.loading import load_causal_lm

PROMPTS = [5, 2, 7, 1, 4, 6]
RESPONSES = [3, 6, 1, 4, 2, 5]
Z = 0.1
OPTIM = OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=0.0)


def _model_type(model_dir: Path) -> str:
    return str(json.loads((model_dir / "config.json").read_text())["model_type"])


def _aux(model_dir: Path) -> float:
    """The load-balancing coefficient the test uses: 0.5 where the model defines the loss (gpt-oss), 0 where
    it does not (DeepSeek-V3)."""
    return 0.0 if _model_type(model_dir) == "deepseek_v3" else 0.5


def _engine(path: Path, kind: ModelKind = ModelKind.CAUSAL_LM, **kw: Any) -> TrainingEngine:
    spec = EngineSpec(
        str(path), kind, Dtype.FLOAT32, optim=OPTIM, moe_aux_loss_coef=_aux(path), moe_z_loss_coef=Z, **kw
    )
    return TrainingEngine(spec)


def _choice(model: Any, layer: int, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the k experts the router of sparse layer `layer` picks [N, k], its distribution [N, E]) from its
    logits, written out here: gpt-oss the top-k of the logits and their softmax; DeepSeek-V3 the top-k of
    sigmoid + correction bias within the best group (a group's score: its 2 best), and the sigmoid scores
    normalised."""
    cfg = model.config
    k = cfg.num_experts_per_tok
    if cfg.model_type == "gpt_oss":
        return logits.topk(k, dim=-1).indices, torch.softmax(logits, dim=-1)
    sparse = [m for m in model.model.layers if hasattr(m.mlp, "gate")]
    bias = sparse[layer].mlp.gate.e_score_correction_bias
    scores = torch.sigmoid(logits)
    biased = (scores + bias).view(len(logits), cfg.n_group, -1)
    best_group = biased.topk(2, dim=-1).values.sum(-1).argmax(-1)  # topk_group 1
    keep = torch.nn.functional.one_hot(best_group, cfg.n_group).bool().unsqueeze(-1).expand_as(biased)
    chosen = biased.masked_fill(~keep, -math.inf).view(len(logits), -1).topk(k, dim=-1).indices
    return chosen, scores / scores.sum(-1, keepdim=True)


def _reference(path: Path, batch: Batch, groups: list[list[int]]) -> tuple[dict[str, float], dict[str, Any]]:
    """Plain transformers, one unpadded row at a time: the policy term (-advantage x log-prob over all
    response tokens), plus per group of rows (a micro-batch) the router's terms over the group's tokens
    weighted by its share of all tokens; backward. The loss, the gradient norm, the metrics averaged over
    groups, and every parameter's gradient."""
    model = load_causal_lm(path)
    rows = list(unpadded_rows(batch))
    total_tokens = sum(len(ids) for ids, _, _ in rows)
    responses = sum(rl for _, _, rl in rows)
    aux_coef = _aux(path)
    loss = torch.zeros(())
    sums: dict[str, float] = {"aux": 0.0, "z": 0.0, "entropy": 0.0, "imbalance_max": 0.0}
    for group in groups:
        per_layer: list[list[torch.Tensor]] = []
        for i in group:
            ids, pl, rl = rows[i]
            out = model(ids[None], output_router_logits=True)
            logp = torch.log_softmax(out.logits[0, pl - 1 : pl + rl - 1].float(), dim=-1)
            taken = logp.gather(1, ids[pl:, None]).squeeze(1)
            loss = loss - (batch["advantages"][i, :rl] * taken).sum() / responses
            per_layer.append(list(out.router_logits))
        layers = [torch.cat(parts) for parts in zip(*per_layer, strict=True)]
        share = layers[0].shape[0] / total_tokens
        z = torch.stack([torch.logsumexp(t, dim=-1).square().mean() for t in layers]).mean()
        loss = loss + share * Z * z
        if aux_coef:
            aux = load_balancing_loss_func(tuple(layers), model.config.num_local_experts, 2)
            loss = loss + share * aux_coef * aux
            sums["aux"] += float(aux.detach())
        sums["z"] += float(z.detach())
        entropies, imbalance = [], []
        for j, logits in enumerate(layers):
            chosen, p = _choice(model, j, logits.detach())
            entropies.append(float(-(p * p.log()).sum(-1).mean()))
            counts = torch.bincount(chosen.reshape(-1), minlength=logits.shape[-1]).float()
            imbalance.append(float(counts.max() / counts.mean()))
        sums["entropy"] += sum(entropies) / len(entropies)
        sums["imbalance_max"] += max(imbalance)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), math.inf)
    want = {
        "loss": float(loss.detach()),
        "grad_norm": float(norm),
        "moe/z_loss": sums["z"] / len(groups),
        "moe/router_entropy": sums["entropy"] / len(groups),
        "moe/load_imbalance_max": sums["imbalance_max"] / len(groups),
    }
    if aux_coef:
        want["moe/aux_loss"] = sums["aux"] / len(groups)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return want, grads


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_logprobs_equal_plain_transformers(moe_shape_dir: Path, packed: bool) -> None:
    batch = make_batch(PROMPTS, RESPONSES)  # rows of up to 13 tokens: past gpt-oss's window of 8
    engine = _engine(moe_shape_dir, remove_padding=packed)
    got, entropy = engine.forward_logprobs(batch, 1.0, MicroSpec(size=4), with_entropy=True)
    with torch.no_grad():
        want, want_entropy = reference_logprobs(load_causal_lm(moe_shape_dir), batch, 1.0)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert entropy is not None
    torch.testing.assert_close(entropy, want_entropy, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("size", "packed", "checkpointing"),
    [(100, False, False), (4, True, True)],
    ids=["padded", "packed-2mb-checkpointing"],
)
def test_update_gradients_equal_plain_transformers(
    moe_shape_dir: Path, size: int, packed: bool, checkpointing: bool
) -> None:
    batch = make_batch(PROMPTS, RESPONSES)  # padded both sides with junk tokens: must not count
    engine = _engine(moe_shape_dir, remove_padding=packed, gradient_checkpointing=checkpointing)
    grads: dict[str, torch.Tensor] = {}
    model = hf_model(engine.module)

    def keep_grads(*_: Any) -> None:
        grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    assert engine.optimizer is not None
    engine.optimizer.register_step_pre_hook(keep_grads)
    got = engine.train_step(batch, pg_loss, MicroSpec(size=size))
    rows = list(range(len(PROMPTS)))
    groups = [rows[i : i + size] for i in range(0, len(rows), size)]
    want, want_grads = _reference(moe_shape_dir, batch, groups)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
    assert ("moe/aux_loss" in got) == bool(_aux(moe_shape_dir))  # DeepSeek-V3 defines no such loss
    assert set(grads) == set(want_grads)
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)
    gpt_oss = _model_type(moe_shape_dir) == "gpt_oss"
    router = "model.layers.1.mlp.router.weight" if gpt_oss else "model.layers.1.mlp.gate.weight"
    assert float(grads[router].abs().max()) > 0  # the router trains: through its weights and the z-loss


def test_a_value_head_on_the_trunk_trains_with_the_router_terms(moe_shape_dir: Path, tmp_path: Path) -> None:
    from quartet.models.tiny import save_value_model

    folder = save_value_model(moe_shape_dir, tmp_path / "value")
    engine = _engine(folder, ModelKind.VALUE)
    assert type(engine.module).__name__.endswith("ForTokenClassification")
    batch = make_batch(PROMPTS, RESPONSES)
    assert engine.forward_values(batch, MicroSpec(size=3)).shape == batch["responses"].shape
    got = engine.train_step(batch, pg_loss_values, MicroSpec(size=100))
    assert got["moe/z_loss"] > 0 and got["grad_norm"] > 0


def pg_loss_values(out: Any, mb: Batch, scale: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """The values' token mean: a value term with a gradient into the trunk."""
    valid = mb["response_mask"] != 0
    return torch.where(valid, out.values, 0.0).sum() / scale.tokens, {}


def test_a_load_balancing_coefficient_is_refused_where_the_model_defines_no_such_loss(
    moe_shape_dir: Path,
) -> None:
    spec = EngineSpec(str(moe_shape_dir), optim=OPTIM, mixed_precision=Dtype.FLOAT32, moe_aux_loss_coef=0.01)
    if _model_type(moe_shape_dir) == "gpt_oss":  # gpt-oss trains with Switch's loss: taken as asked
        engine = TrainingEngine(spec)
        assert engine._router is not None and engine._router.aux_coef == 0.01
        return
    with pytest.raises(ValueError, match=r"actor\.moe_aux_loss_coef.*0 or null"):
        TrainingEngine(spec)
    default = TrainingEngine(EngineSpec(str(moe_shape_dir), optim=OPTIM, mixed_precision=Dtype.FLOAT32))
    assert default._router is not None and default._router.aux_coef == 0.0  # null: none


def test_what_does_not_run_is_refused_when_the_folder_loads(moe_shape_dir: Path) -> None:
    """A model folder (not the tiny config) is refused where it loads: the built-in rollout engine names the
    attention it does not compute; LoRA and expert parallelism name their key; routing record and replay
    name the router they do not reproduce."""
    from quartet.config import ConfigError
    from quartet.engines.model_check import check_model_layout
    from quartet.models.moe import UnsupportedRouterError, moe_routers
    from quartet.rollout import UnsupportedModelError
    from quartet.rollout.torch.model_runner import DecoderRunner

    model = load_causal_lm(moe_shape_dir)
    piece = "attention sinks" if _model_type(moe_shape_dir) == "gpt_oss" else "MLA attention"
    with pytest.raises(UnsupportedModelError, match=f"{piece}.*rollout.engine=vllm"):
        DecoderRunner(model)
    with pytest.raises(ConfigError, match=r"(?s)model\.lora\.rank.*model\.lora\.rank: 0"):
        check_model_layout(model.config, lora_rank=4)
    if piece == "attention sinks":  # gpt-oss's transposed, biased experts; DeepSeek-V3's split (ep tests)
        with pytest.raises(ConfigError, match=r"(?s)model\.expert_parallel_size.*transposed"):
            check_model_layout(model.config, ep=2)
    else:
        check_model_layout(model.config, ep=2)
    with pytest.raises(ConfigError, match=r"(?s)model\.tensor_parallel_size.*mixture-of-experts"):
        check_model_layout(model.config, tp=2)
    check_model_layout(model.config)  # the plain layout runs
    with pytest.raises(UnsupportedRouterError, match="Qwen3-MoE style"):
        moe_routers(model)
