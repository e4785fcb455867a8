"""`quartet demo --device gpu`: the option parses, builds a GPU config whose plan fits one H100, and fails
fast with the fix where torch sees no CUDA device (nothing is trained here)."""

from __future__ import annotations

from typing import Any

import pytest

import quartet.demo
from quartet.cli.main import build_parser, main
from quartet.config import QuartetConfig
from quartet.demo import GPU, demo_config
from quartet.planning.fit import Capacity, fit_config

GiB = 2**30


def _no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine's case, on any machine


def _must_not_run(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the demo started training")


def test_the_option_parses_and_defaults_to_cpu() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).device == "cpu"
    args = parser.parse_args(["demo", "--device", "gpu", "--quick", "trainer.total_steps=5"])
    assert args.device == "gpu" and args.quick and args.overrides == ["trainer.total_steps=5"]
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--device", "tpu"])


def test_the_gpu_config_is_a_larger_model_in_bf16_on_one_gpu() -> None:
    cpu, gpu = demo_config([], 0, False), demo_config([], 0, False, device="gpu")
    assert cpu == demo_config([], 0, False, device="cpu")  # `make demo` is unchanged
    assert gpu.cluster.device == "gpu" and gpu.cluster.world_size == 1
    assert gpu.model.tiny.hidden_size > 4 * cpu.model.tiny.hidden_size
    assert gpu.actor.mixed_precision == gpu.sft.mixed_precision == gpu.rollout.dtype == "bfloat16"
    # the demo's comparison is unchanged: same task, the same held-out problems, the same SFT examples
    assert gpu.sft.builtin == cpu.sft.builtin
    assert (gpu.data.builtin_task, gpu.data.builtin_val_size, gpu.data.seed) == (
        cpu.data.builtin_task,
        cpu.data.builtin_val_size,
        cpu.data.seed,
    )
    assert gpu.sft.max_seconds > 0  # the SFT start is bounded in time as well as in epochs


def _fits_h100(cfg: QuartetConfig) -> bool:
    return fit_config(cfg, device="gpu", capacity=Capacity("gpu", 78 * GiB, 64 * GiB, "H100")).fits


def test_the_gpu_plan_fits_one_h100_and_user_overrides_come_last() -> None:
    assert _fits_h100(demo_config([], 0, False, device="gpu"))
    quick = demo_config(["trainer.total_steps=7"], 4, True, device="gpu")
    assert quick.trainer.total_steps == 7 and quick.trainer.seed == quick.model.tiny.seed == 4
    assert quick.model.tiny == demo_config([], 4, False, device="gpu").model.tiny
    assert _fits_h100(quick)
    assert set(GPU) == {"arithmetic"}
    with pytest.raises(ValueError, match="CPU only"):
        demo_config([], 0, False, task="calculator", device="gpu")


def test_without_cuda_it_fails_fast_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _no_cuda(monkeypatch)
    monkeypatch.setattr(quartet.demo, "run_demo", _must_not_run)
    assert main(["demo", "--device", "gpu"]) == 2
    err = capsys.readouterr().err
    assert "--device gpu needs a CUDA device" in err
    assert "without --device gpu" in err and "nvidia-smi" in err
    # the library call refuses too, before any stage starts
    monkeypatch.undo()
    _no_cuda(monkeypatch)
    monkeypatch.setattr("quartet.sft.SFTTrainer", _must_not_run)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        quartet.demo.run_demo([], device="gpu")


def test_a_cpu_only_task_on_gpu_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--task", "calculator", "--device", "gpu"]) == 2
    assert "CPU only" in capsys.readouterr().err
