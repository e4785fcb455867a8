"""A weight sync into the built-in engine with `rollout.quantization=fp8` re-quantizes exactly what the
trainer sent: each projection's codes and scales equal an independent quantization of the sent tensor bit
for bit, in the same buffers (CUDA graphs keep their addresses), the other tensors are copied as they came,
and the engine then generates what an unquantized engine over the dequantized sent weights generates."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fp8_reference import dequantized_copy, reference_quantize
from rollout_cases import prompt_ids, varied_model

from quartet.config.rollout import FP8_PROJECTIONS
from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine
from quartet.rollout.torch.fp8 import Fp8Linear, Fp8QuantizationError


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[TorchRolloutEngine]:
    eng = TorchRolloutEngine.from_pretrained(tiny_model_dir, max_num_seqs=8, quantization="fp8")
    yield eng
    eng.shutdown()


def _fp8_modules(engine: TorchRolloutEngine) -> dict[str, Fp8Linear]:
    return {n: m for n, m in engine.model.named_modules() if isinstance(m, Fp8Linear)}


def _greedy(engine: TorchRolloutEngine, prompts: list[list[int]]) -> list[tuple[int, ...]]:
    params = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    return [o[0].token_ids for o in engine.generate([GenerationRequest(tuple(p), params) for p in prompts])]


@pytest.mark.parametrize("sent_dtype", [torch.float32, torch.bfloat16])
def test_a_sync_requantizes_exactly_what_the_trainer_sent(
    tiny_model_dir: Path, engine: TorchRolloutEngine, sent_dtype: torch.dtype
) -> None:
    trainer = varied_model(tiny_model_dir, seed=3).to(sent_dtype)  # other weights than the engine loaded
    sent = {n: p.detach().clone() for n, p in trainer.named_parameters()}
    modules = _fp8_modules(engine)
    assert len(modules) == len(FP8_PROJECTIONS) * 2  # the tiny model's two layers
    assert len({id(m.tokens) for m in modules.values()}) == 1  # one activation quantizer, model-wide
    addresses = {n: (m.weight.data_ptr(), m.weight_scale.data_ptr()) for n, m in modules.items()}
    count = engine.load_weights(sent.items(), version=1)
    assert count == len(sent) and engine.weight_version == 1
    for name, module in modules.items():
        codes, scales = reference_quantize(sent[f"{name}.weight"])
        assert torch.equal(module.weight.view(torch.uint8), codes), name
        assert torch.equal(module.weight_scale, scales), name
        assert (module.weight.data_ptr(), module.weight_scale.data_ptr()) == addresses[name]  # in place
    targets = dict(engine.model.named_parameters())
    for name, tensor in sent.items():  # embeddings, norms, biases, head: copied (cast to fp32) as sent
        if name.rsplit(".", 2)[-2] not in FP8_PROJECTIONS or name.endswith(".bias"):
            assert torch.equal(targets[name], tensor.to(torch.float32)), name


def test_after_a_sync_it_generates_as_the_dequantized_sent_model(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    trainer = varied_model(tiny_model_dir, seed=4)
    prompts = prompt_ids(tiny_model_dir)
    before = _greedy(engine, prompts)
    engine.load_weights(trainer.named_parameters(), version=2)
    reference_model = copy.deepcopy(trainer)
    dequantized_copy(reference_model, FP8_PROJECTIONS)
    with TorchRolloutEngine(reference_model, max_num_seqs=8) as reference:
        want = _greedy(reference, prompts)
    got = _greedy(engine, prompts)
    assert got == want
    assert got != before  # the sync changed what it generates
    assert sum(len(set(t)) > 3 for t in got) >= 3  # mostly varied outputs: a real comparison


def test_a_sync_with_a_nan_row_is_refused_naming_the_weight(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    sent = dict(varied_model(tiny_model_dir).named_parameters())
    bad = sent["model.layers.1.mlp.down_proj.weight"].detach().clone()
    bad[5, 2] = float("nan")
    sent["model.layers.1.mlp.down_proj.weight"] = torch.nn.Parameter(bad)
    with pytest.raises(Fp8QuantizationError, match=r"'model.layers.1.mlp.down_proj.weight'.*\[5\]"):
        engine.load_weights(sent.items())
