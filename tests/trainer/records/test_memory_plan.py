"""The trainer plans memory before any worker starts: a run that does not fit is refused with the proposal,
`trainer.auto_fit` runs the proposal, and the measured peaks are logged next to the plan after the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quartet.config import load_config
from quartet.config.loader import apply_overrides
from quartet.planning.estimate import estimate_memory
from quartet.planning.fit import Capacity
from quartet.trainer import RLTrainer
from quartet.trainer.records import memory as trainer_memory
from quartet.trainer.records.memory import MemoryDoesNotFitError, plan_run


def _cfg(tiny_model_dir: Path, tmp_path: Path, *extra: str) -> object:
    return load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "cluster.backend=local",
            "data.train_batch_size=8",
            "data.builtin_train_size=16",
            "data.builtin_val_size=4",
            "data.max_response_length=8",
            "rollout.n=2",
            "actor.mini_batch_size=8",
            "actor.micro_batch_size_per_device=16",
            "actor.logprobs.micro_batch_size_per_device=16",
            "trainer.total_steps=1",
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            *extra,
        ],
    )


def _capacity(fraction: float, cfg: object) -> Capacity:
    peak = estimate_memory(cfg, device="cpu").peak_device  # type: ignore[arg-type]
    return Capacity("cpu", int(fraction * peak), int(fraction * peak), "test")


def test_a_run_that_does_not_fit_is_refused_before_any_worker(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg(tiny_model_dir, tmp_path, "cluster.device=cpu")
    monkeypatch.setattr(trainer_memory, "detect_capacity", lambda kind: _capacity(0.85, cfg))
    trainer = RLTrainer(cfg)  # type: ignore[arg-type]
    with pytest.raises(MemoryDoesNotFitError) as info:
        trainer.run()
    text = str(info.value)
    assert "set trainer.auto_fit=true to apply the proposal" in text and "peak (combined)" in text
    assert not trainer.run_dir.exists()  # nothing started, nothing written


def test_auto_fit_runs_the_proposal_and_logs_plan_and_measured_peaks(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_local_rank: None
) -> None:
    cfg = _cfg(tiny_model_dir, tmp_path, "cluster.device=cpu", "trainer.auto_fit=true")
    monkeypatch.setattr(trainer_memory, "detect_capacity", lambda kind: _capacity(0.85, cfg))
    planned = plan_run(cfg)  # type: ignore[arg-type]
    assert planned.report is not None and planned.report.overrides
    assert planned.cfg == apply_overrides(cfg, planned.report.overrides)  # type: ignore[arg-type]
    result = RLTrainer(cfg).run()  # type: ignore[arg-type]
    assert result.steps == 1
    records = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    plan = next(r for r in records if r["kind"] == "memory_plan")
    assert plan["applied"] == planned.report.overrides and plan["planned_peak_bytes"] > 0
    after = next(r for r in records if r["kind"] == "memory")
    # the measured peak (this process: local backend) is at least the plan's tensors plus the libraries
    assert after["memory/measured_peak_rss_bytes"] > after["planned_peak_bytes"]
    saved = load_config(str(result.run_dir / "config.yaml"))
    assert saved == planned.cfg  # the run folder records the config that ran


def test_memory_check_off_skips_the_plan(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny_model_dir, tmp_path, "trainer.memory_check=false")
    planned = plan_run(cfg)  # type: ignore[arg-type]
    assert planned.report is None and planned.cfg is cfg
