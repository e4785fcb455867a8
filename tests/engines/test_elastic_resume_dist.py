"""Elastic resume on gloo: a checkpoint written by one world size or layout loads on another (dp2 -> dp1,
dp1 -> dp2, dp2 x sp2 -> dp4, tp2 -> tp1, MoE ep2 -> ep1) with every parameter and optimizer state equal,
gathered whole, bit for bit (DCP copies the saved values), the scheduler's state equal, and the next step's
loss and the parameters after it equal to the uninterrupted run's within float tolerance (the reductions
run in another order on another world: rel 1e-5 on the loss, atol 1e-6 / rel 1e-5 on parameters). Each
rank's torch RNG follows `quartet.engines.elastic`: a rank the checkpoint has a file for gets its saved
stream, a new rank the stream seeded from (seed, step, rank).

One world of 1 runs in the test's own process, so the dp2 -> dp1 case spawns two processes only once."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from elastic_worker import SEED, Layout, load_half, run_rank, save_half

from quartet.engines.elastic import derived_seed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _half(half: str, world: int, model_dir: Path, layout: Layout, out: Path) -> None:
    if world == 1:  # here: no process group
        (save_half if half == "save" else load_half)(0, 1, str(model_dir), layout, out)
    else:
        args = (world, _free_port(), half, str(model_dir), layout, str(out))
        mp.spawn(run_rank, args=args, nprocs=world, join=True)


def _assert_equal(saved: object, loaded: object, where: str) -> None:
    if isinstance(saved, torch.Tensor):
        assert isinstance(loaded, torch.Tensor), where
        assert torch.equal(saved, loaded.to(saved.dtype)), where
    elif isinstance(saved, dict):
        assert isinstance(loaded, dict) and set(saved) == set(loaded), (where, set(saved) ^ set(loaded))
        for key in saved:
            _assert_equal(saved[key], loaded[key], f"{where}.{key}")
    elif isinstance(saved, list | tuple):
        assert isinstance(loaded, list | tuple) and len(saved) == len(loaded), where
        for i, (a, b) in enumerate(zip(saved, loaded, strict=True)):
            _assert_equal(a, b, f"{where}[{i}]")
    else:
        assert saved == loaded, (where, saved, loaded)


def _resume(model_dir: Path, out: Path, saved: tuple[int, Layout], loaded: tuple[int, Layout]) -> float:
    """Save on one world, load on the other, check everything; the seconds of the load itself."""
    _half("save", saved[0], model_dir, saved[1], out)
    _half("load", loaded[0], model_dir, loaded[1], out)
    state_saved, state_loaded = torch.load(out / "state_saved.pt"), torch.load(out / "state_loaded.pt")
    assert state_saved["optimizer"]["state"], "the optimizer had stepped: it must have states to compare"
    _assert_equal(state_saved, state_loaded, "state")
    next_saved, next_loaded = torch.load(out / "next_saved.pt"), torch.load(out / "next_loaded.pt")
    assert next_loaded["loss"] == pytest.approx(next_saved["loss"], rel=1e-5)
    moved = 0
    for name, value in next_saved["model"].items():
        torch.testing.assert_close(next_loaded["model"][name], value, atol=1e-6, rtol=1e-5, msg=name)
        moved += int(not torch.equal(value, state_saved["model"][name]))
    assert moved, "the next step must change the parameters"
    for rank in range(loaded[0]):
        rng = torch.load(out / f"rng_loaded_rank{rank}.pt")
        if rank < saved[0]:
            want = torch.load(out / "ckpt" / f"extra_rank{rank}.pt", weights_only=False)["rng"]["cpu"]
        else:
            want = torch.Generator().manual_seed(derived_seed(SEED, 1, rank)).get_state()
        assert torch.equal(rng, want), f"rank {rank}'s RNG"
    return float((out / "load_seconds.txt").read_text())


# in CI: two ranks save, this process loads (12.7 s at load average 1.7 on 2 cores, up to 78 s when busy;
# most of it is starting the two processes); the only spawn of this file outside `slow`
def test_dp2_to_dp1(tiny_model_dir: Path, tmp_path: Path) -> None:
    _resume(tiny_model_dir, tmp_path, (2, {}), (1, {}))


@pytest.mark.slow  # another two-rank spawn; dp2 -> dp1 covers the same code in CI
def test_dp1_to_dp2(tiny_model_dir: Path, tmp_path: Path) -> None:
    _resume(tiny_model_dir, tmp_path, (1, {}), (2, {}))


@pytest.mark.slow  # two four-rank spawns (96 s at load average 5 on 2 cores)
def test_dp2_sp2_to_dp4(tiny_model_dir: Path, tmp_path: Path) -> None:
    _resume(tiny_model_dir, tmp_path, (4, {"sp": 2}), (4, {}))


@pytest.mark.slow  # tensor-parallel DTensors (Shard on dim 0 and 1) to plain tensors
def test_tp2_to_tp1(tiny_model_dir: Path, tmp_path: Path) -> None:
    _resume(tiny_model_dir, tmp_path, (2, {"tp": 2}), (1, {}))


@pytest.mark.slow  # expert weights sharded over the ep group to whole [E, ...] tensors
def test_moe_ep2_to_ep1(moe_dir: Path, tmp_path: Path) -> None:
    _resume(moe_dir, tmp_path, (2, {"ep": 2}), (1, {}))
