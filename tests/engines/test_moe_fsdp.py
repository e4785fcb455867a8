"""Two FSDP2 ranks on gloo update a Qwen3-MoE (and a gpt-oss and a DeepSeek-V3), router loss included,
exactly like one rank holding both ranks' rows."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from engine_cases import pg_loss
from moe_worker import MICRO, full_batch, make_engine, run_rank

from quartet.engines.hf_modules import hf_model
from quartet.models.loading import load_causal_lm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_rank_moe_update_equals_one_rank(moe_model_dir: Path, tmp_path: Path) -> None:
    mp.spawn(run_rank, args=(2, _free_port(), str(moe_model_dir), str(tmp_path)), nprocs=2, join=True)
    single = make_engine(str(moe_model_dir))
    before = {k: v.clone() for k, v in hf_model(single.module).state_dict().items()}
    want = single.train_step(full_batch(), pg_loss, MICRO)
    ranks = [json.loads((tmp_path / f"metrics_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["loss"] == pytest.approx(want["loss"], rel=1e-5)  # policy + router terms, both ranks
    assert ranks[0]["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    # each rank's router metrics are the mean over its own micro-batches; together, the single rank's
    both = (ranks[0]["moe/aux_loss"] + ranks[1]["moe/aux_loss"]) / 2
    assert both == pytest.approx(want["moe/aux_loss"], rel=1e-5)
    # save_pretrained writes the experts one by one (transformers' checkpoint layout); loading fuses them
    exported = load_causal_lm(tmp_path / "hf").state_dict()
    params = hf_model(single.module).state_dict()
    name = "model.layers.0.mlp.gate.weight"  # the router moved, and as one process moves it
    assert float((params[name] - before[name]).abs().max()) > 1e-3
    for key, value in exported.items():
        torch.testing.assert_close(value, params[key], atol=1e-6, rtol=1e-5, msg=key)


@pytest.mark.slow  # two spawned ranks per shape: ~55 s each on a loaded 2-core machine
def test_two_rank_gpt_oss_and_deepseek_updates_equal_one_rank(moe_shape_dir: Path, tmp_path: Path) -> None:
    """The same for gpt-oss (sinks, sliding window, biased experts; load-balancing loss 0.5) and DeepSeek-V3
    (MLA, shared expert, sigmoid grouped router; no load-balancing loss): the loss, the gradient norm and
    every exported weight and buffer after one AdamW step."""
    deepseek = json.loads((moe_shape_dir / "config.json").read_text())["model_type"] == "deepseek_v3"
    aux = 0.0 if deepseek else 0.5
    args = (2, _free_port(), str(moe_shape_dir), str(tmp_path), aux)
    mp.spawn(run_rank, args=args, nprocs=2, join=True)
    single = make_engine(str(moe_shape_dir), aux)
    before = {k: v.clone() for k, v in hf_model(single.module).state_dict().items()}
    want = single.train_step(full_batch(), pg_loss, MICRO)
    ranks = [json.loads((tmp_path / f"metrics_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert ranks[0]["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    both = (ranks[0]["moe/z_loss"] + ranks[1]["moe/z_loss"]) / 2
    assert both == pytest.approx(want["moe/z_loss"], rel=1e-5)
    exported = load_causal_lm(tmp_path / "hf").state_dict()
    params = hf_model(single.module).state_dict()
    name = "model.layers.1.mlp.gate.weight" if deepseek else "model.layers.0.mlp.router.weight"
    assert float((params[name] - before[name]).abs().max()) > 1e-3
    assert set(exported) == set(params)
    for key, value in exported.items():
        torch.testing.assert_close(value, params[key], atol=1e-6, rtol=1e-5, msg=key)
