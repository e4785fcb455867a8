"""Tensor parallelism on gloo: tp=2 (world 2) and dp2 x tp2 (world 4) compute exactly what one process
computes on all the rows.

Log-probs, entropy, every parameter's gradient and the gradient norm of one pass, and after one AdamW step
the loss, the gradient norm, the parameters and the exported full weights (`inference_weights`, what the
rollout receives) are compared with one process holding the same rows, within 1e-5 (float32). Covered:
the tiny Qwen2 (q/k/v biases, tied embeddings, 2 KV heads split over tp) packed and padded, a tiny Llama
(untied lm_head) and a tiny Qwen3 (per-head q/k norms). A checkpoint saved under TP loads back to the
same parameters, and the Hugging Face export holds the updated full weights. A run with the
vocabulary-parallel sum of exponentials not reduced over the group must FAIL the comparison.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from mesh_worker import compare_with_one_process
from tp_worker import make_engine, run_rank

from quartet.config import TinyModelConfig
from quartet.config.model import TinyArch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from quartet.models.tiny import ensure_tiny_model

    spec = TinyModelConfig(arch=TinyArch.LLAMA, tie_word_embeddings=False)
    return ensure_tiny_model(spec, tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def qwen3_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 (per-head q_norm/k_norm, no q/k/v biases) of the tiny Qwen2's shape."""
    from transformers import AutoConfig, Qwen3Config, Qwen3ForCausalLM

    base = AutoConfig.from_pretrained(tiny_model_dir, local_files_only=True)
    shape = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    config = Qwen3Config(
        **{k: getattr(base, k) for k in shape},
        num_key_value_heads=base.num_key_value_heads,
        head_dim=base.hidden_size // base.num_attention_heads,
        tie_word_embeddings=True,
    )
    torch.manual_seed(3)
    folder = tmp_path_factory.mktemp("qwen3")
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tp2_models(tiny_model_dir: Path, llama_dir: Path, qwen3_dir: Path) -> list[str]:
    return [
        f"packed:{tiny_model_dir}",
        f"padded:{tiny_model_dir}",
        f"packed:{llama_dir}",
        f"padded:{qwen3_dir}",
        f"mutant:{tiny_model_dir}",
    ]


@pytest.fixture(scope="module")
def tp2(tp2_models: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tp2")
    mp.spawn(run_rank, args=(2, 2, _free_port(), tp2_models, str(out)), nprocs=2, join=True)
    return out


@pytest.fixture(scope="module")
def dp2_tp2_models(tiny_model_dir: Path, llama_dir: Path) -> list[str]:
    return [f"packed:{tiny_model_dir}", f"padded:{llama_dir}"]


@pytest.fixture(scope="module")
def dp2_tp2(dp2_tp2_models: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dp2tp2")
    mp.spawn(run_rank, args=(4, 2, _free_port(), dp2_tp2_models, str(out)), nprocs=4, join=True)
    return out


# the fixture runs the two-rank worker over four models (~40 s); not `slow`: issue 36 asks for it in CI
@pytest.mark.parametrize(
    "index", [0, 1, 2, 3], ids=["qwen2-packed", "qwen2-padded", "llama-packed", "qwen3-padded"]
)
def test_tp2_equals_one_process(tp2: Path, tp2_models: list[str], index: int) -> None:
    _compare(tp2, tp2_models[index], index, world=2)


# slow (CI time): four processes; tp2 alone (test_tp2_equals_one_process) stays in CI
@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1], ids=["qwen2-packed", "llama-padded"])
def test_dp2_tp2_equals_one_process(dp2_tp2: Path, dp2_tp2_models: list[str], index: int) -> None:
    _compare(dp2_tp2, dp2_tp2_models[index], index, world=4)


def test_checkpoint_round_trips_under_tp(tp2: Path, dp2_tp2: Path) -> None:
    for out in (tp2, dp2_tp2):
        assert json.loads((out / "metrics.json").read_text())["0"]["round_trip"] == 1.0


def test_hf_export_under_tp_holds_the_updated_weights(tp2: Path) -> None:
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tp2 / "hf", local_files_only=True)
    params = torch.load(tp2 / "params0.pt")["params"]  # after the step, before the round trip's extra step
    for name, value in exported.state_dict().items():
        torch.testing.assert_close(value, params[name], atol=0, rtol=0, msg=name)


def test_a_missing_vocabulary_reduction_fails_the_comparison(tp2: Path, tp2_models: list[str]) -> None:
    with pytest.raises(AssertionError):
        _compare(tp2, tp2_models[4], 4, world=2)


def _compare(out: Path, entry: str, index: int, world: int) -> None:
    variant, _, model_dir = entry.partition(":")

    def worth_comparing(grads: dict[str, torch.Tensor]) -> bool:
        return max(float(g.abs().max()) for g in grads.values()) > 1e-3

    single = make_engine(model_dir, 1, packed=variant != "padded")
    compare_with_one_process(out, single, index, world, worth_comparing)
