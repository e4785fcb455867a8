"""The vocabulary-parallel head's math in one process: shards of a full logits tensor, stacked in a leading
dimension, with the group's reductions done over that dimension, against `engines.heads` on the full
logits (values and gradients); and the spec/config errors of tensor parallelism."""

from __future__ import annotations

import pytest
import torch

from quartet.config import ConfigError
from quartet.config.model import LoraConfig, ModelConfig, TinyModelConfig
from quartet.engines import EngineSpec, ModelKind, heads
from quartet.engines.model_check import check_model_layout
from quartet.engines.tensor_parallel import layer_plan
from quartet.engines.vocab_parallel import vocab_parallel_entropy, vocab_parallel_logprobs, vocab_slice


class StackedShards:
    """The reductions of a tensor group whose shards are stacked in dim 0 (every shard sees the result)."""

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t.sum(dim=0, keepdim=True).expand_as(t)

    def max(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().amax(dim=0, keepdim=True).expand_as(t)


def _shards(logits: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[size, b, K, V/size] zero-padded shards of logits and their first vocabulary ids [size, 1, 1]."""
    vocab = logits.shape[-1]
    width = -(-vocab // size)
    parts, starts = [], []
    for rank in range(size):
        start, end = vocab_slice(vocab, size, rank)
        part = logits[..., start:end]
        # a padded column must not count: -inf logits add exp(-inf) = 0 and never hold a target
        pad = torch.full((*part.shape[:-1], width - part.shape[-1]), float("-inf"))
        parts.append(torch.cat([part, pad], dim=-1))
        starts.append(start)
    return torch.stack(parts), torch.tensor(starts).view(size, 1, 1)


@pytest.mark.parametrize(("vocab", "size"), [(12, 2), (12, 4), (11, 3)])
def test_shard_math_equals_the_full_head(vocab: int, size: int) -> None:
    g = torch.Generator().manual_seed(vocab + size)
    logits = (3 * torch.randn(2, 5, vocab, generator=g)).requires_grad_()
    targets = torch.randint(0, vocab, (2, 5), generator=g)
    targets[0, 0], targets[1, 4] = 0, vocab - 1  # the first and last ids (the edges of the slices)
    weights = torch.randn(2, 5, generator=g)
    want_lp = heads.response_logprobs(logits, targets, 0.7)
    want_ent = heads.response_entropy(logits, 0.7)
    (want_grad,) = torch.autograd.grad(((want_lp + 0.3 * want_ent) * weights).sum(), logits)

    stacked, starts = _shards(logits, size)
    reduce = StackedShards()
    lp = vocab_parallel_logprobs(stacked, targets, 0.7, starts, reduce, chunk=3)
    ent = vocab_parallel_entropy(stacked, 0.7, reduce, chunk=3)
    for rank in range(size):  # every shard holds the whole result
        torch.testing.assert_close(lp[rank], want_lp, atol=1e-6, rtol=0)
        torch.testing.assert_close(ent[rank], want_ent, atol=1e-5, rtol=0)  # m ~ 10: float32 ulps
    # one shard's copy of the loss, backpropagated: the reductions' backward hands each shard its part
    (got_grad,) = torch.autograd.grad(((lp[0] + 0.3 * ent[0]) * weights).sum(), logits)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=0)


def test_a_missing_sum_reduction_is_wrong() -> None:
    logits = torch.randn(1, 4, 8)
    targets = torch.tensor([[0, 3, 4, 7]])
    stacked, starts = _shards(logits, 2)

    class NoSum(StackedShards):
        def sum(self, t: torch.Tensor) -> torch.Tensor:
            return t

    lp = vocab_parallel_logprobs(stacked, targets, 1.0, starts, NoSum())
    assert not torch.allclose(lp[0], heads.response_logprobs(logits, targets, 1.0), atol=1e-3)


def test_vocab_slices_cover_the_vocabulary_like_dtensor_chunks() -> None:
    assert [vocab_slice(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [vocab_slice(8, 2, r) for r in range(2)] == [(0, 4), (4, 8)]


def test_layer_plan_splits_attention_and_mlp() -> None:
    plan = layer_plan()
    assert set(plan) == {
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    }


class _Config:
    def __init__(self, model_type: str, heads: int, kv: int) -> None:
        self.model_type = model_type
        self.num_attention_heads = heads
        self.num_key_value_heads = kv


def test_model_checks_name_the_key() -> None:
    check_model_layout(_Config("qwen3", 8, 4), tp=4)
    with pytest.raises(
        ValueError, match="model.tensor_parallel_size=2: no tensor-parallel plan for model type 'gpt2'"
    ):
        check_model_layout(_Config("gpt2", 8, 8), tp=2)
    with pytest.raises(ValueError, match="does not divide the model's 8 attention and 2 key/value heads"):
        check_model_layout(_Config("llama", 8, 2), tp=4)


def test_spec_refuses_what_tp_does_not_cover(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size: must be >= 1"):
        EngineSpec("m", ModelKind.CAUSAL_LM, tensor_parallel_size=0)
    with pytest.raises(ValueError, match="policy \\(causal LM\\) only"):
        EngineSpec("m", ModelKind.VALUE, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="sequence and tensor parallelism are not combined"):
        EngineSpec(
            "m", ModelKind.CAUSAL_LM, remove_padding=True, sequence_parallel_size=2, tensor_parallel_size=2
        )
    with pytest.raises(ValueError, match="LoRA"):
        EngineSpec("m", ModelKind.CAUSAL_LM, lora=LoraConfig(rank=4), tensor_parallel_size=2)
    EngineSpec("m", ModelKind.CAUSAL_LM, tensor_parallel_size=2)  # padded or packed: both fine


def test_config_refuses_sp_with_tp_and_lora_with_tp() -> None:
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        ModelConfig(remove_padding=True, sequence_parallel_size=2, tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        ModelConfig(lora=LoraConfig(rank=4), tensor_parallel_size=2)
    assert ModelConfig(tiny=TinyModelConfig(), tensor_parallel_size=2).tensor_parallel_size == 2


def test_clip_grad_norm_matches_torch_on_plain_tensors() -> None:
    from quartet.engines.tensor_parallel import clip_grad_norm

    g = torch.Generator().manual_seed(5)
    mine = [torch.nn.Parameter(torch.randn(4, 3, generator=g)) for _ in range(3)]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in mine]
    for a, b in zip(mine, theirs, strict=True):
        a.grad = torch.randn(a.shape, generator=g)
        b.grad = a.grad.clone()
    want = float(torch.nn.utils.clip_grad_norm_(theirs, 0.5))
    assert clip_grad_norm(mine, 0.5) == pytest.approx(want, rel=1e-6) and want > 0.5  # it did clip
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
