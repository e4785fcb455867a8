"""The planner under sequence and tensor parallelism and the fused LM head: the division of each part of a
rank's memory against hand computations for a known shape, and the fit proposals that use them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quartet.cli.main import main
from quartet.config import load_config
from quartet.config.loader import apply_overrides
from quartet.config.root import QuartetConfig
from quartet.config.validate import validate
from quartet.planning.activations import (
    FUSED_TOKEN_CHUNK,
    FUSED_VOCAB_BLOCK,
    fused_head_bytes,
    layer_saved_bytes_per_token,
)
from quartet.planning.estimate import estimate_memory
from quartet.planning.fit import HEADROOM, Capacity, fit_config
from quartet.planning.model_shape import HeadKind, ModelShape
from quartet.planning.parallel import Layout, gathered_params, rank_logit_positions, tp_linear_params

GiB = 2**30
GPU_EXAMPLE = "examples/single_gpu/config.yaml"

# A Qwen2-7B-like decoder: D 3584, I 18944, 28 layers, 28 query / 4 key-value heads of 128, V 152064.
QWEN7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}
SMALL = ModelShape(
    model_type="qwen2",
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=256,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    tie_word_embeddings=False,
    qkv_bias=True,
)


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen7b")
    (folder / "config.json").write_text(json.dumps(QWEN7B))
    return folder


def _cfg(folder: Path, *overrides: str) -> QuartetConfig:
    return load_config(GPU_EXAMPLE, [f"model.path={folder}", *overrides])


def _long_rows(folder: Path, *overrides: str) -> QuartetConfig:
    """4 GPUs, rows of 128 + 16384 tokens, one row per micro-batch: activations dominate the update."""
    return _cfg(
        folder,
        "cluster.bundles_per_node=4",
        "data.max_response_length=16384",
        "actor.micro_batch_size_per_device=1",
        "actor.logprobs.micro_batch_size_per_device=1",
        "reference.logprobs.micro_batch_size_per_device=1",
        *overrides,
    )


# ---- the arithmetic, by hand ------------------------------------------------------------------------------


def test_logit_positions_per_rank_count_the_slice_by_hand() -> None:
    # one row, prompt 6, response 10: positions 5..14 predict the response; sp 2 cuts [0, 8) and [8, 16)
    assert rank_logit_positions(1, 6, 10, 1) == 10
    assert rank_logit_positions(1, 6, 10, 2) == 7  # rank 1 holds 8..14
    # two such rows (32 tokens), sp 4 -> slices of 8: row 0 kept 5..14, row 1 kept 21..30
    # rank 0: 5,6,7 (3); rank 1: 8..14 (7); rank 2: 21..23 (3); rank 3: 24..30 (7)
    assert rank_logit_positions(2, 6, 10, 4) == 7
    # 33 tokens over sp 2 pad to 34: slices [0, 17), [17, 34); one row of prompt 1, response 32: kept 0..31
    assert rank_logit_positions(1, 1, 32, 2) == 17


def test_layer_activations_under_tensor_parallelism_by_hand() -> None:
    # bf16 autocast (c = 2), T = 100, padded. Per token: norms 4 x 4 x 64 = 1024; input casts 5 x 2 x 64 =
    # 640; attention 4 x 2 x 64 (q = 4 x 16) + 4 x 4 heads = 528, mask 2 x 100 = 200; MLP 4 x 2 x 256 = 2048.
    assert layer_saved_bytes_per_token(SMALL, 2, 100) == 1024 + 640 + 528 + 200 + 2048
    # tp 2 halves the head-split attention and the column-split MLP, not the norms, casts or mask
    assert layer_saved_bytes_per_token(SMALL, 2, 100, tp=2) == 1024 + 640 + 264 + 200 + 1024
    # packed rows have no mask
    assert layer_saved_bytes_per_token(SMALL, 2, 100, tp=2, packed=True) == 1024 + 640 + 264 + 1024


def test_tensor_parallel_weights_and_gathers_by_hand() -> None:
    # linear weights per layer: q 64x64, k 64x32, v 64x32, o 64x64, gate/up 64x256, down 256x64
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 256
    assert tp_linear_params(SMALL, HeadKind.CAUSAL_LM, 2) == 2 * layer // 2 + 1000 * 64 // 2
    assert tp_linear_params(SMALL, HeadKind.VALUE, 2) == 2 * layer // 2 + 64
    # FSDP gathers the root (embedding 1000x64 whole, head 1000x64 halved, final norm 64) and two layers whose
    # linears are halved (biases 64 + 2 x 32 and norms 2 x 64 whole)
    per_layer = layer // 2 + (64 + 2 * 32) + 2 * 64
    root = 1000 * 64 + 1000 * 64 // 2 + 64
    assert gathered_params(SMALL, HeadKind.CAUSAL_LM, Layout(4, tp=2)) == root + 2 * per_layer
    assert (
        gathered_params(SMALL, HeadKind.CAUSAL_LM, Layout(2, tp=2)) == 0
    )  # one FSDP rank: nothing to gather


def test_fused_head_is_the_hidden_states_and_one_block_by_hand() -> None:
    shape = ModelShape("qwen2", 152064, 3584, 18944, 28, 28, 4, 128, False, qkv_bias=True)
    n = 10_000  # 3 token chunks of 4096; the block is 4096 x 8192
    block = 4096 * 8192 * (2 + 4 * 4)
    forward = 2 * 3584 * n + block + 2 * 8192 * 3584
    assert fused_head_bytes(shape, n, 2, backward=False, entropy=False) == forward
    assert fused_head_bytes(shape, n, 2, backward=True, entropy=False) == forward + 2 * 4 * 3584 * n
    # against the plain head's logits of the same tokens: 10k x 152k bf16 logits alone are 2.8 GiB
    assert forward < 2 * 152064 * n / 4
    # under tensor parallelism the block is at most the rank's share of the vocabulary: 152064 / 32 = 4752
    small_block = 4096 * 4752 * (2 + 4 * 4)
    assert fused_head_bytes(shape, n, 2, tp=32, backward=False, entropy=False) == (
        2 * 3584 * n + small_block + 2 * 4752 * 3584
    )


def test_fused_head_block_sizes_are_the_engines() -> None:
    from quartet.engines.fused_head import TOKEN_CHUNK, VOCAB_BLOCK

    assert (FUSED_TOKEN_CHUNK, FUSED_VOCAB_BLOCK) == (TOKEN_CHUNK, VOCAB_BLOCK)


def test_sequence_parallelism_halves_a_ranks_activations(qwen7b: Path) -> None:
    """One 16,512-token row per micro-batch: with sp 2 each rank runs 8,256 of its tokens, so the trunk's
    activations halve exactly (float32: no head-input casts, which follow the uneven logit positions);
    the sharded states do not change (FSDP2 shards over every rank either way)."""
    fp32 = ("actor.mixed_precision=float32", "model.remove_padding=true")
    one = estimate_memory(_long_rows(qwen7b, *fp32)).row("update_actor", "actor").breakdown
    two = estimate_memory(_long_rows(qwen7b, *fp32, "model.sequence_parallel_size=2")).row(
        "update_actor", "actor"
    )
    assert 2 * two.breakdown["activations"] == one["activations"]
    for state in ("weights", "optimizer", "grads", "fsdp_gather"):
        assert two.breakdown[state] == one[state]
    # the logits follow the larger slice: rank 1 holds 8256..16511, of which 8256..16510 predict the response
    assert rank_logit_positions(1, 128, 16384, 2) == 16510 - 8256 + 1


def test_tensor_parallelism_divides_logits_and_casts_not_states(qwen7b: Path) -> None:
    base = ("cluster.bundles_per_node=4", "model.fused_head=false")
    one = estimate_memory(_cfg(qwen7b, *base)).row("update_actor", "actor").breakdown
    two = estimate_memory(_cfg(qwen7b, *base, "model.tensor_parallel_size=2")).row("update_actor", "actor")
    assert two.breakdown["logits"] * 2 == one["logits"]  # 152064 is even: a vocabulary half per rank
    d, layers = 3584, 28
    per_layer = d * 3584 + 2 * d * 512 + 3584 * d + 3 * d * 18944  # q, k, v, o, gate, up, down
    assert two.breakdown["autocast_weights"] == 2 * (layers * per_layer // 2 + 152064 * d // 2)
    for state in ("weights", "optimizer", "grads"):
        assert two.breakdown[state] == one[state]
    assert two.breakdown["activations"] < one["activations"]


def test_fused_head_replaces_the_logits_where_it_runs(qwen7b: Path) -> None:
    cfg = _cfg(qwen7b)
    gpu = estimate_memory(cfg, device="gpu").row("update_actor", "actor").breakdown
    assert "fused_head" in gpu and "logits" not in gpu  # default: on with CUDA
    cpu = estimate_memory(cfg, device="cpu").row("update_actor", "actor").breakdown
    assert "logits" in cpu and "fused_head" not in cpu
    forced = estimate_memory(_cfg(qwen7b, "model.fused_head=true"), device="cpu")
    assert "fused_head" in forced.row("old_log_prob", "actor").breakdown
    assert gpu["fused_head"] < cpu["logits"]


# ---- proposals --------------------------------------------------------------------------------------------


def test_long_rows_that_do_not_fit_get_a_sequence_parallel_proposal_that_fits(qwen7b: Path) -> None:
    cfg = _long_rows(qwen7b)
    peak = estimate_memory(cfg, device="gpu").peak_device
    cap = Capacity("gpu", 80 * GiB, 1024 * GiB, "test")
    assert peak > HEADROOM * cap.device_bytes  # 16k-token rows of a 7B model do not fit one 80 GB GPU
    report = fit_config(cfg, device="gpu", capacity=cap)
    keys = [o.split("=")[0] for o in report.overrides]
    assert "model.sequence_parallel_size" in keys and "model.remove_padding" in keys
    assert report.fits_after
    if "model.gradient_checkpointing" in keys:  # the cheaper change comes first
        assert keys.index("model.sequence_parallel_size") < keys.index("model.gradient_checkpointing")
    fitted = validate(apply_overrides(cfg, report.overrides))
    assert fitted.model.sequence_parallel_size >= 2 and fitted.model.remove_padding
    assert estimate_memory(fitted, device="gpu").peak_device <= HEADROOM * cap.device_bytes


def test_no_sequence_parallel_proposal_without_devices_or_long_rows(qwen7b: Path) -> None:
    cap = Capacity("gpu", 40 * GiB, 1024 * GiB, "test")
    one_gpu = _long_rows(qwen7b, "cluster.bundles_per_node=1")
    keys = [o.split("=")[0] for o in fit_config(one_gpu, device="gpu", capacity=cap).overrides]
    assert "model.sequence_parallel_size" not in keys and "model.tensor_parallel_size" not in keys
    short = _cfg(qwen7b, "cluster.bundles_per_node=4")  # 384-token rows: weights and states dominate
    keys = [o.split("=")[0] for o in fit_config(short, device="gpu", capacity=cap).overrides]
    assert "model.sequence_parallel_size" not in keys


def test_large_model_with_devices_gets_a_tensor_parallel_proposal(qwen7b: Path) -> None:
    cfg = _cfg(qwen7b, "cluster.bundles_per_node=8", "actor.micro_batch_size_per_device=1")
    cap = Capacity("gpu", 24 * GiB, 1024 * GiB, "test")
    report = fit_config(cfg, device="gpu", capacity=cap)
    tp = [o for o in report.overrides if o.startswith("model.tensor_parallel_size=")]
    assert tp, report.render()
    fitted = validate(apply_overrides(cfg, report.overrides))
    assert 8 % fitted.model.tensor_parallel_size == 0 and fitted.model.tensor_parallel_size >= 2
    peaks = [report.plan.peak_device] + [c.peak_after for c in report.changes]
    assert all(b <= a for a, b in zip(peaks, peaks[1:], strict=False))


def test_quartet_plan_shows_the_layout_and_sizes(qwen7b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", GPU_EXAMPLE, f"model.path={qwen7b}", "cluster.bundles_per_node=4"]
    args += ["model.remove_padding=true", "model.sequence_parallel_size=2"]
    main([*args, "--device", "gpu", "--memory-gib", "80"])
    out = capsys.readouterr().out
    assert "world size 4 = dp 2 x sp 2 x tp 1" in out
    assert "update_actor_tokens" in out
    main([*args, "--device", "gpu", "--memory-gib", "80", "--json"])
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["sequence_parallel_size"] == 2 and plan["data_parallel_size"] == 2
    # 16 prompts x 8 samples over 4 ranks = 32 rows each, 64 pooled by a sequence group; micro-batches of 8
    # rows of 384 tokens, half of them on each rank of the group
    assert plan["sizes"]["update_actor_tokens"] == 8 * 384 // 2
