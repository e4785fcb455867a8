"""Ulysses sequence parallelism in one process: the slicing arithmetic, the all-to-all layout against a
by-hand exchange of tensors, the size-1 group, and the config and spec errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_cases import make_batch

from quartet.config import ConfigError, load_config
from quartet.config.from_verl import translate_overrides
from quartet.config.model import Dtype, ModelConfig
from quartet.engines import EngineSpec, ModelKind
from quartet.engines import ulysses as uly
from quartet.engines.inputs import build_inputs
from quartet.engines.model_check import check_model_layout
from quartet.engines.packing import pack_inputs, varlen_attention


@pytest.mark.parametrize("n", [1, 5, 29, 30, 31])
@pytest.mark.parametrize("sp", [1, 2, 3, 4])
def test_slices_tile_the_padded_sequence(n: int, sp: int) -> None:
    total = uly.padded_length(n, sp)
    assert total % sp == 0 and n <= total < n + sp
    spans = [uly.slice_bounds(n, sp, r) for r in range(sp)]
    assert [a for a, _ in spans] == [z for _, z in [(0, 0), *spans[:-1]]]  # contiguous, in rank order
    assert spans[-1][1] == total and len({z - a for a, z in spans}) == 1  # equal shares


@pytest.mark.parametrize(("n", "sp"), [(29, 2), (30, 4), (8, 4)])
def test_slice_masks_mark_the_real_tokens_of_each_slice(n: int, sp: int) -> None:
    # what the MoE router counts on each rank: the slices' masks joined are n real tokens, then the padding
    masks = [uly.slice_mask(n, uly.SeqGroup(size=sp, rank=r)) for r in range(sp)]
    joined = torch.cat(masks)
    assert joined.shape[0] == uly.padded_length(n, sp) and int(joined.sum()) == n and bool(joined[:n].all())


def test_slice_errors() -> None:
    with pytest.raises(ValueError, match="outside"):
        uly.slice_bounds(10, 2, 2)
    with pytest.raises(ValueError, match=">= 1"):
        uly.padded_length(10, 0)


@pytest.mark.parametrize("sp", [2, 3])
def test_shard_packed_parts_join_to_the_packed_micro_batch(sp: int) -> None:
    packed = pack_inputs(build_inputs(make_batch([3, 1, 4], [2, 5, 1])))
    n = packed.input_ids.shape[1]
    parts = [uly.shard_packed(packed, uly.SeqGroup(size=sp, rank=r)) for r in range(sp)]
    ids = torch.cat([p.input_ids for p in parts], dim=1)
    assert torch.equal(ids[:, :n], packed.input_ids) and bool((ids[:, n:] == 0).all())
    assert torch.equal(torch.cat([p.position_ids for p in parts], dim=1)[:, :n], packed.position_ids)
    share = ids.shape[1] // sp
    keep = torch.cat([p.keep + r * share for r, p in enumerate(parts)])
    assert torch.equal(keep, packed.keep)
    assert torch.equal(torch.cat([p.targets for p in parts]), packed.targets)
    assert all(p.counts == tuple(len(q.keep) for q in parts) for p in parts)
    pad = ids.shape[1] - n
    assert parts[0].bounds == packed.bounds + ((ids.shape[1],) if pad else ())


def _exchange(monkeypatch: pytest.MonkeyPatch, fn: object, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run `fn` on every rank's input with `_all_to_all` simulated by hand: chunk j of rank i's send
    buffer becomes chunk i of rank j's receive buffer."""
    sent: list[torch.Tensor] = []
    monkeypatch.setattr(uly, "_all_to_all", lambda x, g: sent.append(x.clone()) or x)
    for r, x in enumerate(inputs):
        fn(x, uly.SeqGroup(size=len(inputs), rank=r))  # type: ignore[operator]
    received = [torch.stack([sent[i][j] for i in range(len(inputs))]) for j in range(len(inputs))]
    monkeypatch.setattr(uly, "_all_to_all", lambda x, g: received[g.rank])
    return [fn(x, uly.SeqGroup(size=len(inputs), rank=r)) for r, x in enumerate(inputs)]  # type: ignore[operator]


@pytest.mark.parametrize("sp", [2, 4])
def test_all_to_all_layout_against_a_direct_split(monkeypatch: pytest.MonkeyPatch, sp: int) -> None:
    full = torch.randn(3 * sp, 8, 5)  # [tokens, heads, dim]
    heads = _exchange(monkeypatch, uly._seq_to_heads, list(full.chunk(sp)))
    for r, got in enumerate(heads):  # rank r: every token, its block of heads
        assert torch.equal(got, full[:, r * 8 // sp : (r + 1) * 8 // sp])
    back = _exchange(monkeypatch, uly._heads_to_seq, heads)
    for r, got in enumerate(back):  # and back: its own tokens, every head
        assert torch.equal(got, full.chunk(sp)[r])


def test_size_one_group_is_the_identity() -> None:
    one = uly.SeqGroup(size=1, rank=0)
    x = torch.randn(6, 4, 3, requires_grad=True)
    y = uly.heads_to_seq(uly.seq_to_heads(x, one), one)
    assert torch.equal(y, x)
    y.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, torch.ones_like(x))
    z = torch.randn(5)
    assert uly.gather_outputs(z, (5,), one) is z


def test_attention_with_a_size_one_group_equals_varlen() -> None:
    q, k, v = torch.randn(1, 4, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    bounds = (0, 4, 9)
    want, _ = varlen_attention(torch.nn.Identity(), q, k, v, None, 0.3, quartet_bounds=bounds)
    got, _ = uly.ulysses_attention(
        torch.nn.Identity(), q, k, v, None, 0.3, quartet_bounds=bounds, quartet_sp=uly.SeqGroup(1, 0)
    )
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    with pytest.raises(ValueError, match="quartet_sp"):
        uly.ulysses_attention(torch.nn.Identity(), q, k, v, None, quartet_bounds=bounds)


def test_heads_not_divisible_are_refused() -> None:
    with pytest.raises(ValueError, match="3 heads"):
        uly.seq_to_heads(torch.randn(4, 3, 2), uly.SeqGroup(size=2, rank=0))

    class Config:
        num_attention_heads = 6
        num_key_value_heads = 2

    with pytest.raises(ValueError, match="does not divide the model's 6 attention heads"):
        check_model_layout(Config(), sp=4)
    check_model_layout(Config(), sp=3)  # 2 KV heads: replicated


def test_model_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        ModelConfig(sequence_parallel_size=0)
    assert "sequence_parallel_size" in str(info.value)
    assert ModelConfig(sequence_parallel_size=2).sequence_parallel_size == 2  # packs without remove_padding
    with pytest.raises(ConfigError, match="4 attention heads"):
        ModelConfig(sequence_parallel_size=3, remove_padding=True)
    assert ModelConfig(sequence_parallel_size=2, remove_padding=True).sequence_parallel_size == 2


def test_sequence_parallel_size_must_divide_the_pool() -> None:
    sp = ["model.remove_padding=true", "model.sequence_parallel_size=2"]
    with pytest.raises(ConfigError) as info:
        load_config(overrides=sp)
    assert info.value.field == "model.sequence_parallel_size"
    assert "[1]" in info.value.fix
    cfg = load_config(overrides=[*sp, "cluster.backend=ray", "cluster.bundles_per_node=2"])
    assert cfg.model.sequence_parallel_size == 2


def test_verl_ulysses_key_maps() -> None:
    t = translate_overrides(
        [
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.model.use_remove_padding=True",
        ]
    )
    assert t.quartet_values["model.sequence_parallel_size"] == 2


def test_engine_spec_packs_under_sp_and_refuses_the_reward_model(tiny_model_dir: Path) -> None:
    path = str(tiny_model_dir)
    assert EngineSpec(path, ModelKind.CAUSAL_LM, Dtype.FLOAT32, sequence_parallel_size=2).packs
    assert EngineSpec(path, ModelKind.VALUE, sequence_parallel_size=2).packs
    assert not EngineSpec(path, ModelKind.VALUE).packs and EngineSpec(path, remove_padding=True).packs
    assert not EngineSpec(path, ModelKind.REWARD, remove_padding=True).packs
    with pytest.raises(ValueError, match="reward model"):
        EngineSpec(path, ModelKind.REWARD, sequence_parallel_size=2)
    with pytest.raises(ValueError, match=">= 1"):
        EngineSpec(path, sequence_parallel_size=0)


def test_critic_sequence_parallel_size_is_validated_and_mapped_from_verl() -> None:
    gae = ["algorithm.adv_estimator=gae"]
    with pytest.raises(ConfigError, match="critic.sequence_parallel_size"):
        load_config(overrides=["critic.sequence_parallel_size=0"])
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[*gae, "critic.sequence_parallel_size=2"])
    assert info.value.field == "critic.sequence_parallel_size" and "[1]" in info.value.fix
    pool = ["cluster.backend=ray", "cluster.bundles_per_node=3"]
    with pytest.raises(ConfigError, match="4 attention heads"):  # 3 divides the pool, not the tiny heads
        load_config(overrides=[*gae, *pool, "critic.sequence_parallel_size=3"])
    load_config(overrides=["cluster.backend=ray", "critic.sequence_parallel_size=2"])  # no critic: unused
    pool = ["cluster.backend=ray", "cluster.bundles_per_node=2"]
    cfg = load_config(overrides=[*gae, *pool, "critic.sequence_parallel_size=2"])
    assert cfg.critic.sequence_parallel_size == 2 and cfg.model.sequence_parallel_size == 1
    t = translate_overrides(["critic.ulysses_sequence_parallel_size=2"])
    assert t.quartet_values["critic.sequence_parallel_size"] == 2
