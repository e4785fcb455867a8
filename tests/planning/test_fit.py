"""Fitting a config to a device: the proposal is cheapest first, and the planner accepts what it proposes."""

from __future__ import annotations

import json

import pytest

from quartet.cli.main import main
from quartet.config import load_config
from quartet.config.loader import apply_overrides
from quartet.config.validate import validate
from quartet.planning.estimate import estimate_memory
from quartet.planning.fit import HEADROOM, Capacity, fit_config

PPO = "examples/ppo_arithmetic/config.yaml"
MiB = 2**20


def _cpu(mib: int) -> Capacity:
    return Capacity("cpu", mib * MiB, mib * MiB, "test")


def test_a_config_that_fits_gets_no_proposal() -> None:
    cfg = load_config(PPO)
    report = fit_config(cfg, device="cpu", capacity=_cpu(10_000))
    assert report.fits and not report.changes and report.fitted is None


def test_proposal_is_accepted_by_the_planner_it_came_from() -> None:
    cfg = load_config(PPO)
    peak = estimate_memory(cfg, device="cpu").peak_device
    cap = _cpu(int(0.6 * peak / MiB))  # 60% of the plan: it cannot fit as configured
    report = fit_config(cfg, device="cpu", capacity=cap)
    assert not report.fits and report.changes and report.fits_after
    # independently: apply the printed overrides to the original config, validate, plan again
    fitted = validate(apply_overrides(cfg, report.overrides))
    assert fitted == report.fitted
    again = estimate_memory(fitted, device="cpu")
    assert again.peak_device <= HEADROOM * cap.device_bytes < peak
    # each step of the proposal lowered (or kept) the peak: none is there for nothing
    peaks = [peak] + [c.peak_after for c in report.changes]
    assert all(b <= a for a, b in zip(peaks, peaks[1:], strict=False))


def test_gpu_proposal_offloads_before_it_recomputes() -> None:
    cfg = load_config(PPO)
    peak = estimate_memory(cfg, device="gpu").peak_device
    cap = Capacity("gpu", int(0.4 * peak), 64 * 2**30, "test")
    report = fit_config(cfg, device="gpu", capacity=cap)
    keys = [o.split("=")[0] for o in report.overrides]
    assert keys[0] == "reference.param_offload"  # the cheapest change comes first
    if "model.gradient_checkpointing" in keys:
        assert keys.index("actor.optimizer_offload") < keys.index("model.gradient_checkpointing")
    assert report.fits_after


def test_impossible_fit_says_so() -> None:
    report = fit_config(load_config(PPO), device="cpu", capacity=_cpu(1))
    assert not report.fits and not report.fits_after
    assert "NOT fit" in report.render() or "no config change" in report.render()


def test_quartet_plan_cli_exit_codes_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", PPO, "--device", "cpu", "--memory-gib", "8"]) == 0
    assert "peak (combined)" in capsys.readouterr().out
    peak = estimate_memory(load_config(PPO), device="cpu").peak_device
    small = f"{0.6 * peak / 2**30:.6f}"
    assert main(["plan", PPO, "--device", "cpu", "--memory-gib", small, "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False and out["fits_with_proposal"] is True and out["proposal"]
    assert out["plan"]["peak_device_bytes"] == peak
    assert out["fitted_plan"]["peak_device_bytes"] <= HEADROOM * float(small) * 2**30
    assert main(["plan", PPO, "actor.optim.lrr=1"]) == 2


def test_plan_for_a_gpu_without_cuda_names_the_problem_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`quartet plan ... --device gpu` on a machine without CUDA used to end in a TypeError (the
    ConfigError lacked its `problem`); it must be a config error that says what to do instead."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine's case, on any machine
    code = main(["plan", "examples/single_gpu/config.yaml", "--device", "gpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert "TypeError" not in err
    assert "no CUDA device here" in err
    assert "--device cpu" in err and "--memory-gib" in err and "--gpu h100" in err
