"""`quartet config show` and `quartet demo`, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quartet.cli.main import main
from quartet.config import load_config


def test_config_show_prints_resolved_yaml_that_loads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "show", "rollout.n=8", "actor.optim.lr=2e-6"]) == 0
    text = capsys.readouterr().out
    (tmp_path / "shown.yaml").write_text(text)
    cfg = load_config(tmp_path / "shown.yaml")
    assert cfg == load_config(overrides=["rollout.n=8", "actor.optim.lr=2e-6"])


@pytest.mark.parametrize(("given", "kept"), [(None, "10000"), ("5", "5")])
def test_the_cli_shortens_openmp_spinning_unless_told_otherwise(given: str | None, kept: str) -> None:
    """Set before torch loads libgomp, which reads it once (benchmarks/oversubscription.py says why)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"} | (
        {"GOMP_SPINCOUNT": given} if given else {}
    )
    code = "import sys, os, quartet.cli.main; print('torch' in sys.modules, os.environ['GOMP_SPINCOUNT'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", kept]  # torch not loaded yet: the value takes effect


def test_config_show_reports_errors_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "actor.optim.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert "actor.optim.lrr" in err and "did you mean 'actor.optim.lr'" in err


def test_config_show_doc_lists_fields_with_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--doc"]) == 0
    out = capsys.readouterr().out
    assert "rollout.n = 4\n    Responses sampled per training prompt" in out


def test_demo_quick_runs_every_stage_on_ray(tmp_path: Path) -> None:
    """The README's main job, shrunk: SFT start, GRPO on a real local Ray, the control, the table."""
    small = [
        "model.tiny.hidden_size=64",
        "model.tiny.num_hidden_layers=2",
        "model.tiny.intermediate_size=128",
    ]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "quartet.cli.main",
            "demo",
            "--quick",
            f"trainer.output_dir={tmp_path}",
            "sft.epochs=2",
            "trainer.total_steps=3",
            "data.builtin_train_size=256",
            *small,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for row in ("SFT start", "GRPO", "more SFT (control)"):
        assert row in out.stdout
    run = tmp_path / "demo-quick-seed0"
    steps = [json.loads(line) for line in (run / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "step"] == [1, 2, 3]
    for stage in ("sft_start", "grpo", "sft_control"):
        assert (run / stage / "hf" / "config.json").exists()
    assert (run / "grpo" / "cluster.json").exists()  # it ran on Ray, and other tools can find it
    (startup,) = [r for r in steps if r["kind"] == "startup"]  # the time before the first step, by phase
    ray_phases = ["workers/connect_s", "workers/pool_s", "workers/hosts_s", "workers/role/actor_s"]
    assert all(startup[k] > 0 for k in ray_phases)
    assert sum(startup[k] for k in ray_phases) <= startup["workers_s"] + 1e-3
    assert (run / "grpo" / "checkpoints" / "latest").read_text().strip() == "global_step_3"
    plot = run / "grpo" / "plots.png"
    assert "GRPO curves" in out.stdout and plot.stat().st_size > 10_000
    # the demo ends with the command that opens its GRPO run in `quartet inspect`, and the run has the tables
    assert f"quartet inspect {run / 'grpo'}" in " ".join(out.stdout.split())
    assert sorted(p.name for p in (run / "grpo" / "rollouts").glob("step_*.parquet")) == [
        "step_1.parquet",
        "step_2.parquet",
        "step_3.parquet",
    ]


@pytest.mark.slow
def test_train_starts_ray_while_it_imports_the_trainer(tmp_path: Path) -> None:
    """`quartet train` in a fresh process: Ray is started before the trainer's imports end, and the run's
    own connect then finds it (the start-up record says how long each took)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "quartet.cli.main",
            "train",
            f"trainer.output_dir={tmp_path}",
            "cluster.address=local",  # a Ray of its own, even beside a `ray start` cluster
            "trainer.total_steps=1",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.export_final=false",
            "trainer.loggers=[jsonl]",
            "data.builtin_train_size=64",
            "model.tiny.hidden_size=64",
            "model.tiny.num_hidden_layers=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (metrics,) = tmp_path.glob("*/*/metrics.jsonl")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    (startup,) = [r for r in records if r["kind"] == "startup"]
    assert startup["workers/connect_early_s"] > 0  # started while the trainer was imported
    assert startup["workers/connect_s"] < startup["workers/connect_early_s"]  # then only found connected
    assert startup["imports_s"] >= startup["workers/connect_early_s"]  # the overlap is inside the imports
    assert startup["workers/hosts_started_early_s"] > 0  # and the hosts started right after it


@pytest.mark.slow
def test_calculator_demo_quick_with_the_verified_control(tmp_path: Path) -> None:
    """`quartet demo --task calculator --filtered-control`, shrunk: four rows, and the verified control
    trained on exactly the tool traces (the head answers, recounted here from the questions, dropped)."""
    import pyarrow.parquet as pq

    small = ["model.tiny.hidden_size=64", "model.tiny.num_hidden_layers=2"]
    small += ["model.tiny.intermediate_size=128"]
    argv = [sys.executable, "-m", "quartet.cli.main", "demo", "--task", "calculator", "--quick"]
    argv += ["--filtered-control", f"trainer.output_dir={tmp_path}", "sft.epochs=1", "trainer.total_steps=2"]
    argv += ["data.builtin_val_size=16", "data.val_batch_size=16", "sft.builtin.val_size=16"]
    argv += ["sft.builtin.train_size=128", "data.builtin_train_size=128", "rollout.n=4"]
    out = subprocess.run([*argv, *small], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for row in ("SFT start", "GRPO", "more SFT (control)", "verified SFT (control)"):
        assert row in out.stdout
    run = tmp_path / "demo-calculator-quick-seed0"
    traces = pq.read_table(run / "sft_filtered" / "data" / "calculator" / "sft_train.parquet").to_pylist()
    wrong = 0
    for row in traces:
        question = row["messages"][0]["content"].removeprefix("What is ").rstrip("?")
        a, b, c = (int(x) for x in question.split()[::2])
        wrong += row["messages"][-1]["content"] != str(a * b + c)
    assert 0 < wrong < len(traces)
    records = [json.loads(line) for line in (run / "sft_filtered" / "metrics.jsonl").read_text().splitlines()]
    (train_data,) = [r for r in records if r["kind"] == "data" and r["split"] == "train"]
    assert (train_data["kept"], train_data["unverified_filtered"]) == (len(traces) - wrong, wrong)
    control = [r for r in (run / "sft_control" / "metrics.jsonl").read_text().splitlines() if '"data"' in r]
    assert json.loads(control[0])["unverified_filtered"] == 0  # the plain control keeps every trace
