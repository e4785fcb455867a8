"""Expert parallelism on gloo: ep2 (world 2), ep2 x sp2 with the router's losses on (world 2) and dp2 x ep2
(world 4) compute exactly what one process computes on all the rows.

Log-probs, entropy, every parameter's gradient (the experts' gathered to the full [E, ...] tensors) and the
gradient norm of one pass, and after one AdamW step the loss, the gradient norm, the parameters and the
exported full weights (`inference_weights`, what the rollout receives) are compared with one process
holding the same rows, within 1e-5 (float32). The model is the tiny Qwen3-MoE (8 experts, top-2) with its
expert and router weights scaled up, so that the experts weigh in the log-probs and the routing is decisive.
A checkpoint saved under ep2 loads back to the same parameters, and the Hugging Face export holds the
updated full weights. Four mutants must FAIL the same comparison: an all-to-all that drops a chunk, the
experts swapped between the ranks, a combine without the router's weights (all three already in the
log-probs), and expert gradients left ep times too large (in the experts' gradients: the forward is right).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from ep_worker import Case, make_engine, run_rank
from mesh_worker import compare_with_one_process

from quartet.engines.hf_modules import hf_model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ep2_cases(moe_dir: Path) -> list[Case]:
    plain = [(variant, 2, 1, str(moe_dir)) for variant in ("packed", "padded", "ckpt")]
    bugs = [(bug, 2, 1, str(moe_dir)) for bug in ("drop", "swap", "unweighted", "unscaled")]
    return [*plain, *bugs, ("router", 2, 2, str(moe_dir))]  # ep2 x sp2, the router's losses on


@pytest.fixture(scope="module")
def ep2(ep2_cases: list[Case], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ep2")
    mp.spawn(run_rank, args=(2, _free_port(), ep2_cases, str(out)), nprocs=2, join=True)
    return out


@pytest.fixture(scope="module")
def world4_cases(moe_dir: Path) -> list[Case]:
    # dp2 x ep2: experts FSDP-sharded over "edp" (2 ranks)
    return [("packed", 2, 1, str(moe_dir))]


@pytest.fixture(scope="module")
def world4(world4_cases: list[Case], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("world4")
    mp.spawn(run_rank, args=(4, _free_port(), world4_cases, str(out)), nprocs=4, join=True)
    return out


@pytest.mark.parametrize("index", [0, 1, 2], ids=["packed", "padded", "checkpointed"])
def test_ep2_equals_one_process(ep2: Path, ep2_cases: list[Case], index: int) -> None:
    _compare(ep2, ep2_cases[index], index, world=2)


@pytest.mark.parametrize(
    "index",
    [3, 4, 5, 6],
    ids=["dropped-chunk", "swapped-experts", "unweighted-combine", "unscaled-expert-grads"],
)
def test_a_broken_dispatch_fails_the_comparison(ep2: Path, ep2_cases: list[Case], index: int) -> None:
    with pytest.raises(AssertionError, match="experts" if index == 6 else "Tensor-likes are not close"):
        _compare(ep2, ep2_cases[index], index, world=2)


def test_ep2_sp2_with_the_router_loss_equals_one_process(ep2: Path, ep2_cases: list[Case]) -> None:
    """Sequence parallelism on the MoE: the router's statistics summed over the sequence group."""
    _compare(ep2, ep2_cases[7], 7, world=2)


# slow (CI time): four processes; ep2 alone (test_ep2_equals_one_process) stays in CI
@pytest.mark.slow
@pytest.mark.parametrize("index", [0], ids=["dp2-ep2"])
def test_world4_equals_one_process(world4: Path, world4_cases: list[Case], index: int) -> None:
    _compare(world4, world4_cases[index], index, world=4)


def test_checkpoint_round_trips_under_ep(ep2: Path) -> None:
    assert json.loads((ep2 / "metrics.json").read_text())["0"]["round_trip"] == 1.0


def test_an_ep2_checkpoint_loads_into_one_process(ep2: Path, moe_dir: Path) -> None:
    """DCP stores the experts by their global [E, ...] shape: one process reads them back whole."""
    single = make_engine(str(moe_dir), 1)
    single.load(ep2 / "ckpt")  # saved after one step, before the round trip's extra step
    params = torch.load(ep2 / "params0.pt")["params"]
    state = hf_model(single.module).state_dict()
    assert set(state) == set(params)
    for name, value in state.items():
        torch.testing.assert_close(value, params[name], atol=0, rtol=0, msg=name)
    assert single.steps == 1


def test_hf_export_under_ep_holds_the_updated_full_experts(ep2: Path, moe_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(ep2 / "hf", local_files_only=True)
    params = torch.load(ep2 / "params0.pt")["params"]  # after the step, before the round trip's extra step
    experts = exported.model.layers[0].mlp.experts
    assert experts.gate_up_proj.shape[0] == experts.down_proj.shape[0] == 8  # all experts, fused
    for name, value in exported.state_dict().items():
        torch.testing.assert_close(value, params[name], atol=0, rtol=0, msg=name)


def _compare(out: Path, case: Case, index: int, world: int) -> None:
    variant, _, _, model_dir = case

    def every_expert_routed_to(grads: dict[str, torch.Tensor]) -> bool:
        experts = [g for name, g in grads.items() if name.endswith("experts.gate_up_proj")]
        return bool(experts) and all(bool((e.flatten(1).abs().amax(1) > 1e-4).all()) for e in experts)

    single = make_engine(model_dir, 1, packed=variant != "padded", router=variant == "router")
    compare_with_one_process(out, single, index, world, every_expert_routed_to)
