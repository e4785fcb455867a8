"""Expert parallelism on a DeepSeek-V3 shape (gloo, world 2, ep2): what one process computes.

The sparse block differs from Qwen3-MoE's: a sigmoid router with a score correction bias and grouped top-k
(its top-k weights scaled by `routed_scaling_factor`), and a shared expert every token runs next to the
routed ones. `ParallelExperts` replaces only the routed experts (the fused `gate_up_proj` [E, 2I, H] /
`down_proj` [E, H, I], the layout it splits); the router and the shared expert run on each rank's own
tokens. The comparison is the expert-parallel test's (`mesh_worker.compare_with_one_process`): log-probs,
entropy, every gradient (the experts' gathered) and its norm, and after one AdamW step the loss, the
parameters and the exported weights, within 1e-5 (float32). The tiny DeepSeek-V3 (tests/tiny_shapes.py)
has its expert weights scaled x4 so that the experts weigh in the log-probs. A combine without the router's
top-k weights must fail the same comparison.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from ep_worker import Case, make_engine, run_rank
from mesh_worker import compare_with_one_process

from tiny_shapes import tiny_shape_spec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoModelForCausalLM

    from quartet.models.tiny import ensure_tiny_model

    tiny = ensure_tiny_model(tiny_shape_spec("deepseek_v3"), tmp_path_factory.mktemp("deepseek_src"))
    model = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True)
    with torch.no_grad():
        for layer in model.model.layers[1:]:  # the sparse layers (the first is dense)
            layer.mlp.experts.gate_up_proj.mul_(4.0)
            layer.mlp.experts.down_proj.mul_(4.0)
    folder = tmp_path_factory.mktemp("deepseek")
    model.save_pretrained(folder)
    for file in tiny.iterdir():
        if file.is_file() and not (folder / file.name).exists():  # the tokenizer's files
            (folder / file.name).write_bytes(file.read_bytes())
    return folder


@pytest.fixture(scope="module")
def cases(deepseek_dir: Path) -> list[Case]:
    return [(variant, 2, 1, str(deepseek_dir)) for variant in ("packed", "padded", "unweighted")]


@pytest.fixture(scope="module")
def ep2(cases: list[Case], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ep2_deepseek")
    mp.spawn(run_rank, args=(2, _free_port(), cases, str(out)), nprocs=2, join=True)
    return out


def _compare(out: Path, case: Case, index: int) -> None:
    variant, _, _, model_dir = case

    def both_ranks_routed_to(grads: dict[str, torch.Tensor]) -> bool:
        """Per sparse layer, experts of both ranks (both groups) get tokens, most experts do: grouped top-k
        sends each token to one group, and a random correction bias may leave an expert idle."""
        experts = [g for name, g in grads.items() if name.endswith("experts.gate_up_proj")]
        used = [(e.flatten(1).abs().amax(1) > 1e-6) for e in experts]
        halves = [(u[: len(u) // 2].any() and u[len(u) // 2 :].any()) for u in used]
        return bool(experts) and all(halves) and all(int(u.sum()) >= 3 * len(u) // 4 for u in used)

    single = make_engine(model_dir, 1, packed=variant != "padded")
    compare_with_one_process(out, single, index, 2, both_ranks_routed_to)


@pytest.mark.slow  # two spawned ranks, three engines each: about a minute on a loaded 2-core machine
@pytest.mark.parametrize("index", [0, 1], ids=["packed", "padded"])
def test_ep2_deepseek_v3_equals_one_process(ep2: Path, cases: list[Case], index: int) -> None:
    _compare(ep2, cases[index], index)


@pytest.mark.slow
def test_a_combine_without_the_router_weights_fails_the_comparison(ep2: Path, cases: list[Case]) -> None:
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        _compare(ep2, cases[2], 2)
