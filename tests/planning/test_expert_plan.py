"""The planner under expert parallelism and routing replay: a rank's experts as FSDP2 shards them after the
"ep" split, ep proposed where it helps (and only there), and the routing record's bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from quartet.config import load_config
from quartet.config.loader import apply_overrides
from quartet.config.validate import validate
from quartet.planning.estimate import estimate_memory
from quartet.planning.experts import record_bytes_per_token
from quartet.planning.fit import HEADROOM, Capacity, fit_config
from quartet.planning.model_shape import shape_from_config

MOE = "examples/moe/config.yaml"
EXPERTS_HEAVY = [  # 64 experts of width 512 per layer: the routed experts are ~95% of the parameters
    "model.tiny.num_experts=64",
    "model.tiny.moe_intermediate_size=512",
    "cluster.bundles_per_node=2",
    "actor.micro_batch_size_per_device=8",
    "actor.logprobs.micro_batch_size_per_device=8",
]
SMALL_MOE: dict[str, Any] = dict(
    vocab_size=300, hidden_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    num_experts=6, num_experts_per_tok=2, moe_intermediate_size=20, intermediate_size=72,
)  # fmt: skip


def _experts_of_meta_model(config: Qwen3MoeConfig) -> tuple[int, int]:
    """(all parameters, routed-expert parameters) of the model transformers builds on the meta device."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = dict(model.named_parameters())
    experts = sum(p.numel() for n, p in params.items() if ".mlp.experts." in n)
    return sum(p.numel() for p in params.values()), experts


def _fsdp2_rows(rows: int, ranks: int) -> int:
    """Rows of the first (padded) shard when FSDP2 shards a dim-0 of `rows` over `ranks` (torch.chunk)."""
    return torch.empty(rows).chunk(ranks)[0].numel()


@pytest.mark.parametrize(("world", "ep"), [(2, 1), (2, 2), (4, 2), (6, 3), (4, 1)])
def test_rank_expert_weights_are_its_ep_slice_sharded_over_edp(tmp_path: Path, world: int, ep: int) -> None:
    """The actor's weights per rank: its E / ep experts of every layer, FSDP2-sharded (padded) over the
    world / ep ranks of "edp", and the rest of the model over the world, counted on the meta model."""
    config = Qwen3MoeConfig(**SMALL_MOE)
    config.save_pretrained(tmp_path)
    total, experts = _experts_of_meta_model(config)
    per_expert = experts // config.num_experts
    held = _fsdp2_rows(config.num_experts // ep, world // ep)  # experts of a layer this rank holds
    if ep == 2 and world == 2:  # the brief's figure: E / ep x 3 x H x I per MoE layer, float32
        assert held * per_expert == 3 * 3 * (3 * 48 * 20)  # 3 local experts x 3 layers x 3 H I
    cfg = load_config(
        None,
        [
            f"model.path={tmp_path}",
            f"cluster.bundles_per_node={world}",
            f"model.expert_parallel_size={ep}",
            "data.train_batch_size=12",
            "actor.mini_batch_size=12",
            "actor.micro_batch_size_per_device=1",
            "actor.logprobs.micro_batch_size_per_device=1",
        ],
    )
    plan = estimate_memory(cfg, device="gpu")
    row = plan.row("update_actor", "actor").breakdown
    weights = 4 * ((total - experts) // world + held * per_expert)
    assert row["weights"] == weights
    assert row["grads"] == weights and row["optimizer"] == 2 * weights
    assert plan.sizes["experts_per_rank"] == held and plan.sizes["expert_parallel_size"] == ep
    assert plan.to_dict()["expert_parallel_size"] == ep


def test_ep_gathers_a_groups_experts_and_adds_the_dispatch() -> None:
    """At the same world, ep = 2 leaves the states alone, halves the experts in FSDP2's gathered layers and
    adds one MoE layer's all-to-all buffers; the text and JSON name ep and the dispatch."""
    ep1 = estimate_memory(load_config(MOE, EXPERTS_HEAVY), device="cpu")
    ep2 = estimate_memory(load_config(MOE, [*EXPERTS_HEAVY, "model.expert_parallel_size=2"]), device="cpu")
    a, b = (p.row("update_actor", "actor").breakdown for p in (ep1, ep2))
    assert all(a[k] == b[k] for k in ("weights", "grads", "optimizer"))
    h, i, e, k = 128, 512, 64, 2  # hidden, expert width, experts, top-k of the config
    assert a["fsdp_gather"] - b["fsdp_gather"] == 4 * 2 * (e // 2) * 3 * h * i  # two layers, E/2 experts
    tokens = ep2.sizes["update_actor_tokens"]
    assert "ep_dispatch" not in a and b["ep_dispatch"] == tokens * k * h * (2 * 4 + 2 * 4)
    assert "experts over ep 2" in ep2.render_table() and "all-to-all dispatch" in ep2.render_table()


def _capacity(mib: float) -> Capacity:
    return Capacity("cpu", int(mib * 2**20), int(mib * 2**20), "test")


def test_ep_is_proposed_where_ep1_does_not_fit_and_ep2_does() -> None:
    cfg = load_config(MOE, EXPERTS_HEAVY)
    peak1 = estimate_memory(cfg, device="cpu").peak_device
    fitted = validate(apply_overrides(cfg, ["model.expert_parallel_size=2"]))
    peak2 = estimate_memory(fitted, device="cpu").peak_device
    assert peak2 < peak1
    cap = _capacity((peak1 + peak2) / 2 / HEADROOM / 2**20)  # ep 1 is over it, ep 2 under
    report = fit_config(cfg, device="cpu", capacity=cap)
    assert not report.fits and report.fits_after
    assert report.overrides == ["model.expert_parallel_size=2"]
    change = report.changes[0]
    assert change.freed == peak1 - peak2 == peak1 - change.peak_after
    assert "model.expert_parallel_size=2" in report.render() and "frees" in report.render()
    # a config that fits gets no proposal
    assert not fit_config(cfg, device="cpu", capacity=_capacity(2 * peak1 / 2**20)).changes


def test_ep_is_a_hint_when_the_plan_fits_with_little_room() -> None:
    """A plan that fits in 95% of what it may use gets ep as a hint (not a proposal: nothing to apply);
    one with plenty of room gets none."""
    cfg = load_config(MOE, EXPERTS_HEAVY)
    peak1 = estimate_memory(cfg, device="cpu").peak_device
    peak2 = estimate_memory(validate(apply_overrides(cfg, ["model.expert_parallel_size=2"])), device="cpu")
    report = fit_config(cfg, device="cpu", capacity=_capacity(peak1 / 0.95 / HEADROOM / 2**20))
    assert report.fits and not report.changes and report.hint is not None
    assert report.hint.overrides == ("model.expert_parallel_size=2",)
    assert report.hint.freed == peak1 - peak2.peak_device
    assert "little room: model.expert_parallel_size=2 would free" in report.render()
    assert fit_config(cfg, device="cpu", capacity=_capacity(2 * peak1 / 2**20)).hint is None


def test_ep_is_not_proposed_where_experts_are_a_small_share_or_rules_refuse() -> None:
    # the default tiny MoE: experts are a third of its parameters (the embedding dominates)
    light = load_config(MOE, ["cluster.bundles_per_node=2", "actor.micro_batch_size_per_device=8"])
    peak = estimate_memory(light, device="cpu").peak_device
    report = fit_config(light, device="cpu", capacity=_capacity(0.9 * peak / HEADROOM / 2**20))
    assert not any("expert_parallel_size" in o for o in report.overrides)
    # one device: ep needs more than one rank
    one = load_config(MOE, [o for o in EXPERTS_HEAVY if not o.startswith("cluster.")])
    peak = estimate_memory(one, device="cpu").peak_device
    report = fit_config(one, device="cpu", capacity=_capacity(0.9 * peak / HEADROOM / 2**20))
    assert not any("expert_parallel_size" in o for o in report.overrides)


def test_ep_proposal_takes_a_size_that_divides_the_experts_and_the_world() -> None:
    """6 experts on 4 ranks: 2 divides both, 3 not the world, 4 not the experts: 2 is all there is."""
    overrides = [*EXPERTS_HEAVY[1:], "model.tiny.num_experts=6", "cluster.bundles_per_node=4"]
    overrides += ["model.tiny.moe_intermediate_size=8192", "model.tiny.num_hidden_layers=2"]
    cfg = load_config(MOE, overrides)
    peak = estimate_memory(cfg, device="cpu").peak_device
    report = fit_config(cfg, device="cpu", capacity=_capacity(0.5 * peak / 2**20))
    eps = [o for o in report.overrides if o.startswith("model.expert_parallel_size=")]
    assert eps == ["model.expert_parallel_size=2"]


def test_tensor_parallelism_is_not_proposed_for_an_moe_folder_sequence_parallelism_is(tmp_path: Path) -> None:
    """The engines refuse tp on a mixture of experts and run Ulysses sp on a Qwen3-MoE; for a model folder
    the config does not know it is one, so the planner must not offer tp (long rows: sp helps)."""
    Qwen3MoeConfig(**{**SMALL_MOE, "vocab_size": 32768}).save_pretrained(tmp_path)
    cfg = load_config(
        None,
        [
            f"model.path={tmp_path}",
            "cluster.bundles_per_node=2",
            "data.max_prompt_length=64",
            "data.max_response_length=4096",
            "data.train_batch_size=4",
            "actor.mini_batch_size=4",
        ],
    )
    peak = estimate_memory(cfg, device="cpu").peak_device
    report = fit_config(cfg, device="cpu", capacity=_capacity(0.5 * peak / 2**20))
    keys = {o.split("=")[0] for o in report.overrides}
    assert "model.tensor_parallel_size" not in keys
    assert "model.sequence_parallel_size" in keys


QWEN3_30B_A3B: dict[str, Any] = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
    num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
    num_experts=128, num_experts_per_tok=8,
)  # fmt: skip


def test_routing_record_bytes_at_qwen3_30b_a3b_shape(tmp_path: Path) -> None:
    """48 MoE layers x k = 8 uint8 indices (E = 128): 384 bytes per token, on the rollout's row while it
    generates and in the batch the actor holds; a replayed micro-batch widens its slice to int64."""
    config = Qwen3MoeConfig(**QWEN3_30B_A3B)
    assert record_bytes_per_token(shape_from_config(config)) == 384
    wide = Qwen3MoeConfig(**{**QWEN3_30B_A3B, "num_experts": 512})  # indices past 255: int16
    assert record_bytes_per_token(shape_from_config(wide)) == 768
    config.save_pretrained(tmp_path)
    base = [
        f"model.path={tmp_path}",
        "data.max_prompt_length=512",
        "data.max_response_length=1536",
        "data.train_batch_size=4",
        "rollout.n=2",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size_per_device=2",
        "actor.logprobs.micro_batch_size_per_device=2",
    ]
    off = estimate_memory(load_config(None, base), device="gpu")
    assert "routing_record" not in json.dumps(off.to_dict())
    plan = estimate_memory(load_config(None, [*base, "actor.routing_replay=rollout"]), device="gpu")
    rows, seq = 8, 2048  # 4 prompts x 2 samples on one rank, full length
    assert plan.row("gen", "rollout").breakdown["routing_record"] == rows * seq * 384
    update = plan.row("update_actor", "actor").breakdown
    assert update["routing_record"] == rows * seq * 384
    assert update["routing_indices"] == 2 * seq * 48 * 8 * 8  # 2 rows of int64 indices
    old = plan.row("old_log_prob", "actor").breakdown
    assert old["routing_indices"] == 2 * 2 * seq * 48 * 8 * 8  # and the routers' own top-k (mismatch)
    assert plan.sizes["routing_bytes_per_token"] == 384


def test_plan_json_carries_ep_the_dispatch_and_the_proposal(capsys: pytest.CaptureFixture[str]) -> None:
    """`quartet plan --json` on a config that fits only with ep 2: the proposal, and the fitted plan's ep,
    experts per rank and dispatch."""
    from quartet.cli.main import main

    cfg = load_config(MOE, EXPERTS_HEAVY)
    peak1 = estimate_memory(cfg, device="cpu").peak_device
    peak2 = estimate_memory(validate(apply_overrides(cfg, ["model.expert_parallel_size=2"])), device="cpu")
    gib = (peak1 + peak2.peak_device) / 2 / HEADROOM / 2**30
    args = ["plan", MOE, *EXPERTS_HEAVY, "--device", "cpu", "--memory-gib", f"{gib:.6f}"]
    assert main([*args, "--json"]) == 3  # does not fit as configured
    out = json.loads(capsys.readouterr().out)
    assert out["proposal"] == ["model.expert_parallel_size=2"] and out["fits_with_proposal"]
    fitted = out["fitted_plan"]
    assert fitted["expert_parallel_size"] == 2 and fitted["sizes"]["experts_per_rank"] == 32
    update = next(r for r in fitted["rows"] if r["phase"] == "update_actor" and r["role"] == "actor")
    assert update["breakdown"]["ep_dispatch"] > 0
