"""`quartet demo --model moe`: the arithmetic demo with examples/moe's tiny Qwen3-MoE. Its config is that
model with the router's loss coefficients and nothing else changed, other tasks and the GPU are refused
naming the flags, and (slow) the whole pipeline runs through the CLI into a folder of its own."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import quartet.demo
from quartet.cli.main import build_parser, main
from quartet.config import load_config
from quartet.demo import MOE, demo_config

ROOT = Path(__file__).resolve().parents[2]


def _must_not_run(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the demo started training")


def test_the_moe_demo_is_the_example_moe_model_and_otherwise_the_dense_demo() -> None:
    example = load_config(str(ROOT / "examples" / "moe" / "config.yaml"))
    dense, moe = demo_config([], 0, False), demo_config([], 0, False, model="moe")
    assert moe.model.tiny == example.model.tiny  # arch, width, depth, 8 experts of 256, top-2 (seed 0 both)
    assert moe.model.tiny.arch == "qwen3_moe"
    assert (moe.actor.moe_aux_loss_coef, moe.actor.moe_z_loss_coef) == (0.01, 0.001)
    assert (moe.actor.moe_aux_loss_coef, moe.actor.moe_z_loss_coef) == (
        example.actor.moe_aux_loss_coef,
        example.actor.moe_z_loss_coef,
    )
    # the rest is the dense demo: the same data, GRPO, SFT and scoring; only the folder's name differs
    same_actor = dataclasses.replace(moe.actor, moe_aux_loss_coef=None, moe_z_loss_coef=0.0)
    assert same_actor == dense.actor
    assert dataclasses.replace(moe.model, tiny=dense.model.tiny) == dense.model
    for section in ("data", "rollout", "sft", "algorithm", "cluster", "critic", "reference", "reward"):
        assert getattr(moe, section) == getattr(dense, section), section
    assert moe.trainer.experiment_name != dense.trainer.experiment_name
    assert dataclasses.replace(moe.trainer, experiment_name="demo") == dense.trainer
    # seeds, --quick and the user's overrides apply on top, as for the dense demo
    quick = demo_config(["model.tiny.num_experts=4"], 3, True, model="moe")
    assert quick.model.tiny.num_experts == 4 and quick.model.tiny.seed == 3
    assert quick.trainer.total_steps == demo_config([], 3, True).trainer.total_steps
    assert set(MOE) == {"arithmetic"}


def test_the_option_parses_and_defaults_to_dense() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).model == "dense"
    assert parser.parse_args(["demo", "--model", "moe", "--quick"]).model == "moe"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--model", "mixtral"])


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--task", "calculator"], "--task calculator"),
        (["--task", "vision"], "--task vision"),
        (["--device", "gpu"], "--device gpu"),
    ],
)
def test_other_tasks_and_the_gpu_are_refused_naming_the_flags(
    flags: list[str], named: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(quartet.demo, "run_demo", _must_not_run)
    assert main(["demo", "--model", "moe", *flags]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and "--model moe" in err and named in err and "Fix: drop" in err
    with pytest.raises(ValueError, match="--model moe"):  # the library call too, before any stage
        quartet.demo.pipeline.run_demo([], model="moe", **_kwargs(flags))


def _kwargs(flags: list[str]) -> dict[str, str]:
    return {flags[0].removeprefix("--"): flags[1]}


def _expert_share(cfg: Any) -> tuple[int, int]:
    """(total, active) parameters of the exported model, counted on the module transformers builds: the
    active count leaves out each layer's experts a token is not routed to."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())
    idle = (cfg.num_experts - cfg.num_experts_per_tok) / cfg.num_experts
    experts = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    return total, total - round(experts * idle)


@pytest.mark.slow
def test_the_moe_demo_runs_every_stage_through_the_cli(tmp_path: Path) -> None:
    """`quartet demo --model moe --quick`, shrunk: three rows, the title names the model with its total and
    active parameters, GRPO's steps carry the router's metrics, and the run has a folder of its own."""
    small = ["model.tiny.hidden_size=64", "model.tiny.num_hidden_layers=2", "model.tiny.num_experts=4"]
    small += ["model.tiny.moe_intermediate_size=64", "sft.epochs=2", "trainer.total_steps=2"]
    small += ["data.builtin_train_size=256", "data.builtin_val_size=16", "data.val_batch_size=16"]
    argv = [sys.executable, "-m", "quartet.cli.main", "demo", "--model", "moe", "--quick"]
    out = subprocess.run(
        [*argv, f"trainer.output_dir={tmp_path}", *small], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for row in ("SFT start", "GRPO", "more SFT (control)"):
        assert f"│ {row} " in out.stdout
    run = tmp_path / "demo-moe-quick-seed0"  # not demo-quick-seed0: a dense run's models stay
    from transformers import AutoConfig

    exported = AutoConfig.from_pretrained(run / "grpo" / "hf")
    assert exported.model_type == "qwen3_moe" and exported.num_experts == 4
    total, active = _expert_share(exported)
    words = " ".join(out.stdout.split())
    assert f"tiny Qwen3-MoE: {active:,} of {total:,} parameters active (2 of 4 experts)" in words
    assert f"tiny Qwen3-MoE: {active / 1e6:.2f}M of {total / 1e6:.2f}M parameters active" in out.stdout
    assert "quartet demo --task arithmetic --model moe" in words
    steps = [json.loads(line) for line in (run / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["moe/aux_loss"] > 0 and r["moe/z_loss"] > 0 for r in steps)
    assert "--quick is a smoke" in words and "quartet demo --model moe (~" in words
