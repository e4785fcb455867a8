"""GKD's per-position outputs against independent computations: the teacher's top-k and the student's
log-probs at given ids, from the fused head (vocabulary blocks, never [N, V]) and from the plain head, equal a
full log-softmax of transformers' own logits row by row; the support's gradient equals autograd through that
log-softmax; packed passes refuse them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_cases import make_batch

from gkd_cases import TEMPERATURE, full_logprobs
from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.fused_head import fused_logprobs_entropy
from quartet.engines.head_outputs import ExtraOutputs, ExtrasUnsupported
from quartet.engines.inputs import build_inputs
from quartet.engines.support_head import support_from_hidden, topk_from_hidden, topk_from_logits

PROMPTS = [5, 9, 3]
RESPONSES = [4, 1, 7]


def engine(model_dir: Path, fused: bool, packed: bool = False) -> TrainingEngine:
    spec = EngineSpec(
        str(model_dir),
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=OptimConfig(lr=1e-3),
        fused_head=fused,
        remove_padding=packed,
    )
    return TrainingEngine(spec)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
def test_top_k_equals_a_full_log_softmax_of_transformers_logits(tiny_model_dir: Path, fused: bool) -> None:
    batch = make_batch(PROMPTS, RESPONSES, prompt_width=10, response_width=8, seed=3, temperature=TEMPERATURE)
    out = engine(tiny_model_dir, fused).forward_policy(
        batch, TEMPERATURE, MicroSpec(size=2), extras=ExtraOutputs(top_k=5)
    )
    values, ids = out.required("topk_logprobs"), out.required("topk_ids")
    assert values.shape == ids.shape == (3, 8, 5)
    for i, reference in enumerate(full_logprobs(tiny_model_dir, batch)):
        r = reference.shape[0]
        top = reference.topk(5, dim=-1)
        torch.testing.assert_close(values[i, :r].double(), top.values, atol=2e-5, rtol=0)
        assert torch.equal(ids[i, :r], top.indices)
        assert (values[i, r:] == 0).all() and (ids[i, r:] == 0).all()  # past the response: zeros


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
def test_support_logprobs_and_their_gradient(tiny_model_dir: Path, fused: bool) -> None:
    batch = make_batch(PROMPTS, RESPONSES, prompt_width=10, response_width=8, seed=4, temperature=TEMPERATURE)
    g = torch.Generator().manual_seed(0)
    support = torch.randint(0, 500, (3, 8, 4), generator=g)
    batch = batch.union(Batch({"support": support}))
    eng = engine(tiny_model_dir, fused)
    got = eng._run(batch, build_inputs(batch), TEMPERATURE, False, extras=ExtraOutputs(support_key="support"))
    values = got.required("support_logprobs")
    for i, reference in enumerate(full_logprobs(tiny_model_dir, batch)):
        r = reference.shape[0]
        expected = reference.gather(-1, support[i, :r])
        torch.testing.assert_close(values[i, :r].double(), expected, atol=2e-5, rtol=0)
    values.sum().backward()  # reaches the weights (the fused head's backward through the recovered lse)
    grads = [p.grad for p in eng.module.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(x).all() for x in grads) and any(x.abs().sum() > 0 for x in grads)


def test_fused_support_gradient_equals_autograd_through_the_full_softmax() -> None:
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(37, 8, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(37, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 37, (6,), generator=g)
    ids = torch.randint(0, 37, (6, 5), generator=g)
    up = torch.randn(6, 5, generator=g, dtype=torch.float64)
    lp, _ = fused_logprobs_entropy(hidden, weight, bias, targets, 0.9, vocab_block=7)
    fused = support_from_hidden(hidden, weight, bias, targets, lp, ids, 0.9, torch.float64)
    grads = torch.autograd.grad((fused * up).sum(), (hidden, weight, bias))
    full = torch.log_softmax((hidden @ weight.T + bias) / 0.9, dim=-1).gather(-1, ids)
    reference = torch.autograd.grad((full * up).sum(), (hidden, weight, bias))
    torch.testing.assert_close(fused.double(), full, atol=1e-5, rtol=0)  # float32 log-probs of the head
    for a, b in zip(grads, reference, strict=True):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5)


def test_blockwise_top_k_equals_the_top_k_of_the_full_logits() -> None:
    g = torch.Generator().manual_seed(2)
    hidden, weight, bias = torch.randn(9, 8, generator=g), torch.randn(37, 8, generator=g), torch.randn(37)
    for k in (1, 5, 37):
        values, ids = topk_from_hidden(hidden, weight, bias, k, 1.3, torch.float32, vocab_block=4)
        ref_values, ref_ids = topk_from_logits((hidden @ weight.T + bias).unsqueeze(0), k, 1.3)
        torch.testing.assert_close(values, ref_values[0], atol=1e-5, rtol=0)
        assert torch.equal(ids, ref_ids[0])
    with pytest.raises(ValueError, match="1 <= k <= vocabulary"):
        topk_from_hidden(hidden, weight, bias, 38, 1.0, torch.float32)


def test_packed_passes_refuse_extras(tiny_model_dir: Path) -> None:
    batch = make_batch(PROMPTS, RESPONSES, seed=5, temperature=TEMPERATURE)
    with pytest.raises(ExtrasUnsupported, match="packed passes"):
        engine(tiny_model_dir, False, packed=True).forward_policy(
            batch, TEMPERATURE, MicroSpec(size=2), extras=ExtraOutputs(top_k=2)
        )
