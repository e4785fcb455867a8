"""Units of the engine: request types, scheduler admission, KV cache slots, weight names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quartet.rollout import FinishReason, GenerationRequest, SamplingParams
from quartet.rollout.torch.kv_cache import SlotKVCache
from quartet.rollout.torch.scheduler import Scheduler, split_into_groups
from quartet.rollout.torch.sequence import SequenceState
from quartet.rollout.torch.stopping import StopChecker
from quartet.rollout.weights import load_named_tensors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"n": 0}, "n must"),
        ({"stop": ("",)}, "stop strings"),
    ],
)
def test_sampling_params_reject_impossible_values(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_requests_normalise_their_inputs() -> None:
    params = SamplingParams(stop_token_ids=[3, 4], stop=["ab"])  # type: ignore[arg-type]
    assert params.stop_token_ids == (3, 4) and params.stop == ("ab",)
    request = GenerationRequest([1, 2], params)  # type: ignore[arg-type]
    assert request.prompt_token_ids == (1, 2)
    assert GenerationRequest((1,)).request_id != GenerationRequest((1,)).request_id
    with pytest.raises(ValueError, match="empty"):
        GenerationRequest(())


def seqs(prompt_len: int, n: int) -> list[SequenceState]:
    request = GenerationRequest(tuple(range(1, prompt_len + 1)), SamplingParams(n=n))
    return [SequenceState(request, j, j, 8, frozenset()) for j in range(n)]


def test_scheduler_admits_in_order_within_slots_and_budget() -> None:
    sched = Scheduler(max_prefill_tokens=40)
    a, b, c = (
        split_into_groups(seqs(10, 2), 4),
        split_into_groups(seqs(10, 3), 4),
        split_into_groups(seqs(5, 1), 4),
    )
    sched.add(a + b + c)
    assert sched.admit(free_slots=4) == a  # b needs 3 slots, 2 left: it blocks c (first come, first served)
    assert sched.admit(free_slots=4) == b + c
    big = split_into_groups(seqs(30, 1), 4)
    small = split_into_groups(seqs(30, 1), 4)
    sched.add(big + small)
    assert sched.admit(free_slots=8) == big  # 2 prompts x 30 tokens exceed the 40-token prefill budget
    assert len(sched) == 1


def test_requests_with_more_samples_than_slots_are_split() -> None:
    groups = split_into_groups(seqs(3, 5), 2)
    assert [[s.sample_index for s in g.sequences] for g in groups] == [[0, 1], [2, 3], [4]]


def test_cache_growth_keeps_contents_and_move_copies_slots() -> None:
    cache = SlotKVCache(
        num_layers=2, num_slots=3, num_kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu")
    )
    cache.ensure_capacity(10, used=0)
    assert cache.capacity == 64
    key = torch.arange(3 * 5 * 2, dtype=torch.float32).view(3, 1, 5, 2)
    cache.write_prefill(0, key, -key, start=0, expand=None)
    cache.ensure_capacity(100, used=5)
    assert cache.capacity >= 100
    keys_t = key.transpose(2, 3)  # keys are stored [slots, heads, hd, capacity]
    assert torch.equal(cache.keys[0][..., :5], keys_t) and torch.equal(cache.values[0][:, :, :5], -key)
    cache.move([0], [2], length=5)
    assert torch.equal(cache.keys[0][0, ..., :5], keys_t[2]) and torch.equal(
        cache.values[0][0, :, :5], -key[2]
    )
    # prefix sharing: one prompt row written into two slots
    cache.write_prefill(1, key[:1], key[:1], start=1, expand=torch.tensor([0, 0]))
    assert torch.equal(cache.values[1][1, :, :5], key[0]) and torch.equal(cache.values[1][2, :, :5], key[0])
    assert torch.equal(cache.keys[1][2, ..., :5], keys_t[0])
    cache.free()
    assert not cache.allocated and cache.nbytes() == 0


def test_weight_names_cover_tied_parameters_and_wrappers() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(4, 2)
            self.head = nn.Linear(2, 4, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    new = torch.full((4, 2), 3.0)
    assert load_named_tensors(model, [("_orig_mod.head.weight", new)]) == 1
    assert torch.equal(model.embed.weight, new)


def test_importing_rollout_does_not_import_transformers() -> None:
    import subprocess
    import sys

    code = "import sys, quartet.rollout\nassert 'transformers' not in sys.modules\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_min_tokens_defers_stop_ids_and_strings_but_not_the_length_limit() -> None:
    checker = StopChecker([5], tokenizer=None)
    request = GenerationRequest((1, 2), SamplingParams(min_tokens=3, max_new_tokens=4))
    seq = SequenceState(request, 0, 0, 4, checker.stop_ids(request.sampling))
    for token in (5, 1):  # a stop id among the first min_tokens - 1 tokens does not end it
        seq.token_ids.append(token)
        checker.check(seq, 0)
        assert not seq.finished
    seq.token_ids.append(5)  # the min_tokens-th token may stop it (vLLM's rule)
    checker.check(seq, 0)
    assert seq.finish_reason is FinishReason.STOP and seq.stop_reason == 5
    short = SequenceState(request, 0, 0, 2, frozenset({5}))  # context left room for 2 tokens only
    short.token_ids += [5, 5]
    checker.check(short, 0)
    assert short.finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize(
    ("family", "name"),
    [
        ("llama", "LlamaRMSNorm"),
        ("qwen2", "Qwen2RMSNorm"),
        ("qwen3", "Qwen3RMSNorm"),
        ("mistral", "MistralRMSNorm"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_rms_norm_equals_each_familys_own_bit_for_bit(
    family: str, name: str, dtype: torch.dtype
) -> None:
    import importlib

    from quartet.rollout.torch.model_runner import _RMS_NORMS, _norm

    cls = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), name)
    assert name in _RMS_NORMS
    norm = cls(96, eps=1e-5).to(dtype)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        norm.weight.normal_(generator=gen)
    x = (torch.randn(5, 3, 96, generator=gen) * 4).to(dtype)
    assert torch.equal(_norm(norm, x), norm(x))
    layer_norm = nn.LayerNorm(96).to(dtype)  # not an RMSNorm: run as it is
    assert torch.equal(_norm(layer_norm, x), layer_norm(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_three_kernel_rotary_embedding_equals_transformers(dtype: torch.dtype) -> None:
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    from quartet.rollout.torch.kernels.rope_cache import apply_rope, signed_sin

    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(3, h, 5, 16, generator=gen).to(dtype) for h in (4, 2))
    angles = torch.randn(3, 5, 8, generator=gen) * 3
    cos, sin = (
        torch.cat((angles, angles), -1).cos().to(dtype),
        torch.cat((angles, angles), -1).sin().to(dtype),
    )
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    tables = cos.unsqueeze(1), signed_sin(sin.unsqueeze(1))
    # float32: equal to rounding. bf16: the sum may round once instead of twice, so a result differs by up to
    # one unit in the last place of its terms (2**-5 for terms under 8), also where they cancel to ~0.
    tol = {"atol": 1e-6, "rtol": 0.0} if dtype is torch.float32 else {"atol": 2**-5, "rtol": 0.0}
    torch.testing.assert_close(apply_rope(q, *tables), want_q, **tol)
    torch.testing.assert_close(apply_rope(k, *tables), want_k, **tol)
