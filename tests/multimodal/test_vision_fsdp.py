"""Two FSDP2 ranks (gloo) train the tiny Qwen2-VL exactly like one rank holding both ranks' rows: each
decoder layer and each vision block sharded on its own, the frozen vision tower or a trained one."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from fsdp_vlm_worker import MICRO, logprob_loss, make_engine, rank_rows, run_rank

from quartet.core.batch import Batch
from quartet.engines import MicroSpec
from quartet.engines.hf_modules import hf_model
from quartet.models.loading import load_causal_lm

pytestmark = pytest.mark.slow  # two processes that each load torch and transformers: ~1 min here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def two_ranks(tiny_vlm_dir: Path, rollout: Batch, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp-vlm")
    torch.save(rollout, out / "batch.pt")
    mp.spawn(run_rank, args=(2, _free_port(), str(tiny_vlm_dir), str(out / "batch.pt"), str(out)), nprocs=2)
    return out


@pytest.mark.parametrize("freeze", [True, False])
def test_two_ranks_equal_one(two_ranks: Path, tiny_vlm_dir: Path, rollout: Batch, freeze: bool) -> None:
    single = make_engine(str(tiny_vlm_dir), freeze)
    logprobs, _ = single.forward_logprobs(rollout, 1.0, MicroSpec(size=3))
    sharded = torch.cat([torch.load(two_ranks / f"logprobs_{freeze}_rank{r}.pt") for r in (0, 1)])
    torch.testing.assert_close(sharded, logprobs, atol=1e-5, rtol=0)
    before = {k: v.clone() for k, v in hf_model(single.module).state_dict().items()}
    metrics = single.train_step(rollout, logprob_loss, MICRO)
    assert json.loads((two_ranks / "metrics.json").read_text())[str(freeze)]["grad_norm"] == pytest.approx(
        metrics["grad_norm"], rel=1e-5
    )
    params = hf_model(single.module).state_dict()
    exported = load_causal_lm(two_ranks / f"hf_{freeze}").state_dict()  # saved names differ from live ones
    visual_moved = any(not torch.equal(params[k], before[k]) for k in params if k.startswith("model.visual."))
    assert visual_moved is not freeze
    for name, value in exported.items():
        torch.testing.assert_close(value, params[name], atol=1e-6, rtol=1e-5, msg=name)
    assert len(rank_rows(rollout, 0)) != len(rank_rows(rollout, 1))
