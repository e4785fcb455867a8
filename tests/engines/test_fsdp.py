"""Two FSDP2 ranks on gloo update the model exactly like one rank holding both ranks' rows."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from fsdp_worker import LORA, LOSSES, MICRO, full_batch, make_engine, make_reward_engine, run_rank
from safetensors.torch import load_file

from quartet.engines import MicroSpec
from quartet.engines.hf_modules import hf_model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir: Path, reward_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    args = (2, _free_port(), str(tiny_model_dir), str(reward_model_dir), str(out))
    mp.spawn(run_rank, args=args, nprocs=2, join=True)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_two_rank_update_equals_one_rank_on_all_rows(
    two_ranks: Path, tiny_model_dir: Path, loss: str
) -> None:
    single = make_engine(str(tiny_model_dir))
    before = {k: v.clone() for k, v in hf_model(single.module).state_dict().items()}
    metrics = single.train_step(full_batch(), LOSSES[loss], MICRO)
    sharded = json.loads((two_ranks / "metrics.json").read_text())[loss]
    assert sharded["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
    assert sharded["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    exported = load_file(two_ranks / f"hf_{loss}" / "model.safetensors")
    params = hf_model(single.module).state_dict()
    assert max(float((params[k] - before[k]).abs().max()) for k in exported) > 1e-3
    for name, value in exported.items():
        torch.testing.assert_close(value, params[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.slow
def test_two_rank_fused_head_update_equals_one_plain_rank(two_ranks: Path, tiny_model_dir: Path) -> None:
    """FSDP2 shards the root's lm_head (tied to the embeddings); the fused head runs inside the root's
    forward, so it sees the whole weight and its gradient is reduce-scattered like the plain logits'."""
    single = make_engine(str(tiny_model_dir))
    metrics = single.train_step(full_batch(), LOSSES["token"], MICRO)
    sharded = json.loads((two_ranks / "metrics.json").read_text())["fused"]
    assert sharded["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
    assert sharded["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    exported = load_file(two_ranks / "hf_fused" / "model.safetensors")
    params = hf_model(single.module).state_dict()
    for name, value in exported.items():
        torch.testing.assert_close(value, params[name], atol=1e-6, rtol=1e-5, msg=name)
    want, _ = single.forward_logprobs(full_batch(), 0.7, MicroSpec(size=3))
    got = torch.cat([torch.load(two_ranks / f"fused_logprobs_rank{r}.pt") for r in range(2)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_sharded_checkpoint_loads_on_one_rank(two_ranks: Path, tiny_model_dir: Path) -> None:
    single = make_engine(str(tiny_model_dir))
    single.train_step(full_batch(), LOSSES["token"], MICRO)
    resumed = make_engine(str(tiny_model_dir))
    resumed.load(two_ranks / "ckpt")  # written by 2 ranks, read by 1: DCP reshards
    assert resumed.steps == 1
    want, got = single.state_dict(), resumed.state_dict()
    for name, value in want["model"].items():
        torch.testing.assert_close(got["model"][name], value, atol=1e-6, rtol=1e-5, msg=name)
    for name, state in want["optimizer"]["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(got["optimizer"]["state"][name][key], state[key], atol=1e-7, rtol=1e-4)


@pytest.mark.slow
def test_sharded_logprobs_with_uneven_micro_batch_counts(two_ranks: Path, tiny_model_dir: Path) -> None:
    single = make_engine(str(tiny_model_dir))
    single.train_step(full_batch(), LOSSES["token"], MICRO)
    want, _ = single.forward_logprobs(full_batch(), 1.0, MicroSpec(size=1))
    got = torch.cat([torch.load(two_ranks / f"logprobs_rank{r}.pt") for r in range(2)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_two_rank_lora_update_equals_one_rank(two_ranks: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    single = make_engine(str(tiny_model_dir), LORA)
    metrics = single.train_step(full_batch(), LOSSES["token"], MICRO)
    sharded = json.loads((two_ranks / "metrics.json").read_text())["lora"]
    assert sharded["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
    folder = single.export_hf(tmp_path / "hf")
    assert folder is not None
    want = load_file(folder / "model.safetensors")
    got = load_file(two_ranks / "hf_lora" / "model.safetensors")
    assert set(got) == set(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.slow
def test_sharded_reward_scores(two_ranks: Path, reward_model_dir: Path) -> None:
    want = make_reward_engine(str(reward_model_dir)).forward_scores(full_batch(), MicroSpec(size=8))
    got = torch.cat([torch.load(two_ranks / f"scores_rank{r}.pt") for r in range(2)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
