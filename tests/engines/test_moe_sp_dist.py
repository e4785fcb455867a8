"""Ulysses sequence parallelism on a mixture-of-experts model, the router's load-balancing loss and z-loss
ON, on gloo in float32: sp2, sp2 with gradient checkpointing, ep2 x sp2 and an MoE critic at sp2 (world 2),
dp2 x ep2 x sp2 and sp2 x ep4 (world 4) compute exactly what one process computes on all the rows.

Compared with one process holding the same rows, within 1e-5: log-probs and entropy (the critic: its
values); every parameter's gradient (the experts' gathered whole), their norm and the `moe/*` metrics of
one pass with the router terms; after one AdamW step (two micro-batches) the loss, the gradient norm, the
`moe/*` metrics and the parameters. The model is the tiny Qwen3-MoE with scaled expert and router weights
(`moe_dir`), so the routing is decisive and the load-balancing loss weighs in the router's gradient. The
mutant that forms the router terms on each rank's token slice (statistics not summed over the sequence
group) must fail.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from moe_sp_worker import Case, forward, loss_of, make_engine, router_gradients, run_rank
from sp_worker import MICRO, full_batch

from quartet.engines.hf_modules import hf_model

MOE_METRICS = ("moe/aux_loss", "moe/z_loss", "moe/router_entropy", "moe/load_imbalance_max")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def sp2_cases(moe_dir: Path) -> list[Case]:
    return [("packed", 1, 2, str(moe_dir)), ("unreduced", 1, 2, str(moe_dir))]


@pytest.fixture(scope="module")
def sp2(sp2_cases: list[Case], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("moe_sp2")
    mp.spawn(run_rank, args=(2, _free_port(), sp2_cases, str(out)), nprocs=2, join=True)
    return out


@pytest.fixture(scope="module")
def more_cases(moe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    from quartet.models.tiny import save_value_model

    torch.manual_seed(3)
    value_dir = save_value_model(moe_dir, tmp_path_factory.mktemp("moe_value"))  # MoE trunk + value head
    return [("ckpt", 1, 2, str(moe_dir)), ("packed", 2, 2, str(moe_dir)), ("critic", 1, 2, str(value_dir))]


@pytest.fixture(scope="module")
def more(more_cases: list[Case], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("moe_sp2_more")
    mp.spawn(run_rank, args=(2, _free_port(), more_cases, str(out)), nprocs=2, join=True)
    return out


@pytest.fixture(scope="module")
def world4_cases(moe_dir: Path) -> list[Case]:
    # dp2 x ep2 x sp2: sequence and expert groups {0, 1}, {2, 3}; sp2 x ep4: one expert group over both
    return [("packed", 2, 2, str(moe_dir)), ("packed", 4, 2, str(moe_dir))]


@pytest.fixture(scope="module")
def world4(world4_cases: list[Case], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("moe_sp2_world4")
    mp.spawn(run_rank, args=(4, _free_port(), world4_cases, str(out)), nprocs=4, join=True)
    return out


# slow: the two-rank run takes ~30 s on a quiet 2-core machine (over CI's 10 s per test); the statistics'
# sum is checked in CI by tests/core/test_router.py, the slices' padding by tests/engines/test_ulysses.py
@pytest.mark.slow
def test_sp2_equals_one_process(sp2: Path, sp2_cases: list[Case]) -> None:
    _compare(sp2, sp2_cases[0][3], 0, world=2)


@pytest.mark.slow
def test_router_terms_of_each_slice_fail_the_comparison(sp2: Path, sp2_cases: list[Case]) -> None:
    with pytest.raises(AssertionError, match=r"\.weight"):  # a gradient (the message is its name)
        _compare(sp2, sp2_cases[1][3], 1, world=2)
    right, wrong = (torch.load(sp2 / f"case{i}.pt")["grads"] for i in (0, 1))
    gate = "model.layers.0.mlp.gate.weight"  # the router's own gradient differs, well above rounding
    assert float((right[gate] - wrong[gate]).abs().max()) > 1e-3
    ranks = _ranks(sp2, 2)  # and each rank's aux loss is its slice's, not the micro-batch's
    assert abs(ranks[0]["1"]["pass"]["moe/aux_loss"] - ranks[0]["0"]["pass"]["moe/aux_loss"]) > 1e-3


# slow (CI time): a second two-rank run
@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1, 2], ids=["checkpointing", "ep2-sp2", "critic"])
def test_sp2_variants_equal_one_process(more: Path, more_cases: list[Case], index: int) -> None:
    _compare(more, more_cases[index][3], index, world=2, critic=more_cases[index][0] == "critic")


# slow (CI time): four processes
@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1], ids=["dp2-ep2-sp2", "sp2-ep4"])
def test_world4_equals_one_process(world4: Path, world4_cases: list[Case], index: int) -> None:
    _compare(world4, world4_cases[index][3], index, world=4)


def _ranks(out: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"metrics_rank{r}.json").read_text()) for r in range(world)]


def _compare(out: Path, model_dir: str, index: int, world: int, critic: bool = False) -> None:
    single = make_engine(model_dir, 1, critic=critic)
    batch = full_batch()
    want_out = forward(single, batch)
    got = [torch.load(out / f"fwd{index}_rank{rank}.pt") for rank in range(world)]  # each rank: its rows
    assert set(got[0]) == set(want_out)
    for key, want_t in want_out.items():
        torch.testing.assert_close(torch.cat([g[key] for g in got]), want_t, atol=1e-5, rtol=0, msg=key)
    # one pass: a sequence group's micro-batch is all its rows (world 2: 0-7; world 4: 0-3 and 4-7)
    groups = [slice(0, 8)] if world == 2 else [slice(0, 4), slice(4, 8)]
    want_grads, want_norm, want_pass = router_gradients(single, batch, groups)
    saved = torch.load(out / f"case{index}.pt")
    assert set(saved["grads"]) == set(want_grads)
    gate = "model.layers.0.mlp.gate.weight"
    assert float(want_grads[gate].abs().max()) > 1e-3  # the router learns (its loss and the policy's)
    for name, grad in want_grads.items():
        torch.testing.assert_close(saved["grads"][name], grad, atol=1e-5, rtol=1e-5, msg=name)
    ranks = [r[str(index)] for r in _ranks(out, world)]
    assert ranks[0]["pass"]["grad_norm"] == pytest.approx(want_norm, rel=1e-5)
    for key in MOE_METRICS:  # the first group's micro-batch, on each of its ranks
        assert ranks[0]["pass"][key] == pytest.approx(want_pass[key], rel=1e-5), key
        assert ranks[1]["pass"][key] == pytest.approx(want_pass[key], rel=1e-5), key
    want = single.train_step(batch, loss_of(critic), MICRO, with_entropy=not critic)
    assert ranks[0]["step"]["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert ranks[0]["step"]["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    leaders = ranks[::2] if world == 4 else ranks[:1]  # one rank per sequence group: its micro-batches
    for key in MOE_METRICS:
        mean = sum(r["step"][key] for r in leaders) / len(leaders)
        assert mean == pytest.approx(want[key], rel=1e-5), key
    for name, value in hf_model(single.module).state_dict().items():
        torch.testing.assert_close(saved["params"][name], value, atol=1e-6, rtol=1e-5, msg=name)
