"""Two FSDP2 ranks (gloo) train the tiny Qwen2-VL's critic exactly like one rank holding both ranks' rows,
the vision tower trained: a rank whose micro-batch has no image runs the stand-in image, so both ranks run
the same sharded vision blocks."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from fsdp_vlm_critic_worker import MICRO, make_critic, run_rank, value_loss
from fsdp_vlm_worker import rank_rows

from quartet.core.batch import Batch
from quartet.engines.hf_modules import hf_model
from quartet.models.loading import load_value_model
from quartet.models.tiny import save_value_model

pytestmark = pytest.mark.slow  # two processes that each load torch and transformers: ~1 min here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_critic_ranks_equal_one(tiny_vlm_dir: Path, rollout: Batch, tmp_path: Path) -> None:
    torch.manual_seed(0)
    value_dir = save_value_model(tiny_vlm_dir, tmp_path / "value")
    torch.save(rollout, tmp_path / "batch.pt")
    assert all(m is None for m in rank_rows(rollout, 1).non_tensors["multi_modal_inputs"][:2])  # stand-in
    args = (2, _free_port(), str(value_dir), str(tmp_path / "batch.pt"), str(tmp_path))
    mp.spawn(run_rank, args=args, nprocs=2)
    single = make_critic(str(value_dir))
    values = single.forward_values(rollout, MICRO)
    sharded = torch.cat([torch.load(tmp_path / f"values_rank{r}.pt") for r in (0, 1)])
    torch.testing.assert_close(sharded, values, atol=1e-5, rtol=0)
    before = {k: v.clone() for k, v in hf_model(single.module).state_dict().items()}
    metrics = single.train_step(rollout, value_loss, MICRO)
    assert json.loads((tmp_path / "metrics.json").read_text())["grad_norm"] == pytest.approx(
        metrics["grad_norm"], rel=1e-5
    )
    params = hf_model(single.module).state_dict()
    assert any(not torch.equal(params[k], before[k]) for k in params if k.startswith("model.visual."))
    exported = load_value_model(tmp_path / "hf").state_dict()
    for name, value in exported.items():
        torch.testing.assert_close(value, params[name], atol=1e-6, rtol=1e-5, msg=name)
