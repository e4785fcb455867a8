"""The built-in engine's MoE routing record: the top-k experts of every token it fed, checked against the
routing transformers' own forward computes for the same tokens, and laid over the batch's columns."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from quartet.core.batch import Batch
from quartet.core.routing import ROUTED_EXPERTS, routing_bytes_per_token, routing_dtype
from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine, outputs_to_batch
from quartet.rollout.batch_io import pad_rollout
from quartet.rollout.torch.engine_core import EngineCore
from quartet.rollout.torch.graph_decode import BucketedDecoder
from quartet.rollout.types import GenerationOutput

SHAPE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=None,
)
TOP_K = 2
PROMPTS = [[5, 9, 33, 2, 7, 81], [3], [100, 101, 102], [40, 41]]
MAX_NEW = [9, 4, 12, 1]


def moe_model() -> Qwen3MoeForCausalLM:
    """A random Qwen3-MoE (8 experts, 2 per token) at a scale where every layer matters."""
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        head_dim=16, num_experts=8, num_experts_per_tok=TOP_K, moe_intermediate_size=32, **SHAPE
    )
    model = Qwen3MoeForCausalLM(config)
    model.train(False)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)
    return model


def generate(engine: TorchRolloutEngine) -> list[list[GenerationOutput]]:
    """Two samples per prompt (the prompt prefilled once, its record shared), at most 3 running at once."""
    return engine.generate(
        [
            GenerationRequest(tuple(p), SamplingParams(n=2, max_new_tokens=m, seed=i, ignore_eos=True))
            for i, (p, m) in enumerate(zip(PROMPTS, MAX_NEW, strict=True))
        ]
    )


def hf_routing(model: Qwen3MoeForCausalLM, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' own routing of `ids` (one unpadded sequence): the top-k indices [T, L, k] and the
    sorted router probabilities [T, L, E] (to tell a near tie from a wrong record)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=model.device), output_router_logits=True)
    probs = torch.stack([torch.softmax(r.float().cpu(), dim=-1) for r in out.router_logits], dim=1)
    return probs.topk(TOP_K, dim=-1).indices, probs.sort(dim=-1, descending=True).values


def assert_same_routing(record: torch.Tensor, model: Qwen3MoeForCausalLM, ids: list[int]) -> None:
    """`record` [T, L, k] holds transformers' top-k set for every token, except where the k-th and the
    (k+1)-th expert are tied to 1e-5 (float rounding may order those either way)."""
    want, probs = hf_routing(model, ids)
    assert record.shape == want.shape
    same = (record.long().sort(-1).values == want.sort(-1).values).all(-1)
    tied = (probs[..., TOP_K - 1] - probs[..., TOP_K]).abs() < 1e-5
    assert bool((same | tied).all()), f"{int((~same).sum())} of {same.numel()} (token, layer) pairs differ"
    assert float(same.float().mean()) > 0.9


def test_every_fed_token_has_the_routing_of_transformers_forward() -> None:
    model = moe_model()
    with TorchRolloutEngine(model, max_num_seqs=3, record_routing=True) as engine:
        outputs = generate(engine)
    for prompt, outs in zip(PROMPTS, outputs, strict=True):
        for out in outs:
            record = out.routed_experts
            assert record is not None and record.dtype == torch.uint8
            # the prompt and every generated token but the last (sampled, never fed back)
            assert record.shape == (len(prompt) + len(out.token_ids) - 1, SHAPE["num_hidden_layers"], TOP_K)
            assert_same_routing(record, model, prompt + list(out.token_ids[:-1]))
    first, second = outputs[0]
    assert first.token_ids != second.token_ids  # two samples, one shared prompt record
    assert torch.equal(first.routed_experts[:6], second.routed_experts[:6])  # type: ignore[index]


def test_the_bucketed_decode_step_records_the_running_rows() -> None:
    """The decode step of the CUDA graphs (here its eager twin on CPU: rows padded to a power of two, the
    length to a quantum) keeps the running rows' routing only, the same as transformers'."""
    model = moe_model()
    with TorchRolloutEngine(model, max_num_seqs=3, record_routing=True) as engine:
        core: EngineCore = engine.core
        core.decoder = BucketedDecoder(engine.runner, 3, capture=False, length_quantum=8)
        outputs = generate(engine)
        assert core.decoder.shapes  # the bucketed step ran
    for prompt, outs in zip(PROMPTS, outputs, strict=True):
        for out in outs:
            assert out.routed_experts is not None
            assert_same_routing(out.routed_experts, model, prompt + list(out.token_ids[:-1]))


def test_no_record_unless_asked_and_none_for_a_dense_model() -> None:
    model = moe_model()
    with TorchRolloutEngine(model, max_num_seqs=3) as engine:
        assert all(o.routed_experts is None for outs in generate(engine) for o in outs)
        assert not engine.runner.model._forward_hooks and not model.model.layers[0].mlp.gate._forward_hooks
    dense = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    try:
        TorchRolloutEngine(dense, record_routing=True)
    except ValueError as exc:
        assert "no mixture-of-experts layers" in str(exc)
    else:
        raise AssertionError("a dense model must refuse record_routing")


def test_a_weight_load_mid_response_keeps_the_routing_of_the_tokens_fed_before_it() -> None:
    """A partial rollout across weight versions (`weight_sync.apply=between_steps`): the load lands between
    two decode steps; the record is the concatenation of what each version's steps fed, never recomputed.
    The engine is stepped by hand (its thread never starts), so the load lands at a known step."""
    model = moe_model()
    old = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(5)
    routers = {
        name: torch.randn(p.shape, generator=gen) * 3.0 / p.shape[1] ** 0.5
        for name, p in model.named_parameters()
        if name.endswith("mlp.gate.weight")
    }
    engine = TorchRolloutEngine(model, max_num_seqs=2, record_routing=True)
    prompt = PROMPTS[0]
    request = GenerationRequest(tuple(prompt), SamplingParams(max_new_tokens=12, seed=0, ignore_eos=True))
    try:
        core = engine.core
        core.add(request)
        finished = []
        while not finished:
            if core.steps == 5:
                engine.load_weights(list(routers.items()), version=1)
            finished += core.step()
    finally:
        engine.shutdown()
    out = finished[0].to_output()
    assert out.versions is not None and out.routed_experts is not None
    record, versions = out.routed_experts, list(out.versions)
    assert 0 < versions.count(0) < len(versions) and versions == sorted(versions)
    # the prompt row is prefilled with token 0's version; generated token j is fed by the step that samples
    # token j + 1, under that token's version
    before = len(prompt) + versions[1:].count(0)
    ids = prompt + list(out.token_ids[:-1])
    assert_same_routing(record[:before], old, ids[:before])  # version 0's own routing, kept
    old_routing, _ = hf_routing(old, ids)
    changed = ~(record[before:].long().sort(-1).values == old_routing[before:].sort(-1).values).all(-1)
    assert float(changed.float().mean()) > 0.3  # version 1's routers chose otherwise after the load


def test_the_batch_lays_the_record_over_prompts_and_responses() -> None:
    model = moe_model()
    width = max(len(p) for p in PROMPTS)
    prompts = torch.zeros(len(PROMPTS), width, dtype=torch.int64)
    mask = torch.zeros_like(prompts)
    for i, p in enumerate(PROMPTS):
        prompts[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    rows = Batch({"prompts": prompts, "attention_mask": mask})
    with TorchRolloutEngine(model, max_num_seqs=3, record_routing=True) as engine:
        outputs = generate(engine)
    batch = pad_rollout(outputs_to_batch(rows, outputs, 0, 1.0), width + 3, max(MAX_NEW) + 5, 0)
    routed = batch[ROUTED_EXPERTS]
    p = width + 3
    assert routed.shape == (8, p + max(MAX_NEW) + 5, 2, TOP_K) and routed.dtype == torch.uint8
    flat = [o for outs in outputs for o in outs]
    for row, out in enumerate(flat):
        record, plen, rlen = out.routed_experts, len(PROMPTS[row // 2]), len(out.token_ids)
        assert record is not None
        assert torch.equal(routed[row, p - plen : p], record[:plen])
        assert torch.equal(routed[row, p : p + rlen - 1], record[plen:])
        assert not routed[row, : p - plen].any() and not routed[row, p + rlen - 1 :].any()


def test_the_index_dtype_and_the_bytes_per_token() -> None:
    assert routing_dtype(8) == torch.uint8 and routing_dtype(256) == torch.uint8
    assert routing_dtype(257) == torch.int16
    assert routing_bytes_per_token(48, 8, 128) == 384  # Qwen3-30B-A3B


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_graphs_record_inside_the_graph() -> None:
    """Decode steps replayed from CUDA graphs keep recording: the stacked indices are an output of the graph.
    The experts run as `batched_mm` (no host sync, so a decode step can be captured)."""
    model = moe_model()
    model.config._experts_implementation = "batched_mm"
    model.to("cuda")
    with TorchRolloutEngine(model, max_num_seqs=3, record_routing=True, cuda_graphs=True) as engine:
        outputs = generate(engine)
        decoder = engine.core.decoder
        assert decoder is not None and decoder.captures > 0
    for prompt, outs in zip(PROMPTS, outputs, strict=True):
        for out in outs:
            assert out.routed_experts is not None and out.routed_experts.device.type == "cpu"
            assert_same_routing(out.routed_experts, model, prompt + list(out.token_ids[:-1]))
