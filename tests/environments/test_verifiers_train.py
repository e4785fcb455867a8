"""A verifiers environment trained through `quartet train` (in CI: the issue's end-to-end check):
tools/verifiers_data.py writes the multi-turn fixture environment's rows
(tests/environments/verifiers_envs/quartet_vf_multi.py), and 2 GRPO steps run its episodes (env_response
hints, the stop condition, the rubric's reward) with a tiny model. Checked from the run's own files: 2
steps with finite rewards, no unscored episode and the env's rubric metrics, and every rollout record's
score is the episode's reward, within what verifiers' rubric can give (found: 0 or 1, quick: 1/turns)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENVS = Path(__file__).parent / "verifiers_envs"


def _tool() -> Any:
    """tools/verifiers_data.py as a module."""
    spec = importlib.util.spec_from_file_location("verifiers_data", ROOT / "tools" / "verifiers_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _data(
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[Path, Path]:
    """The rows, written by the tool (the fixtures' folder on the import path, as an installed package)."""
    monkeypatch.syspath_prepend(str(ENVS))
    train, val = _tool().main([str(out), "--env", "quartet-vf-multi"])
    said = capsys.readouterr().out
    assert "(4 rows) and" in said and "(no eval set: from train)" in said
    return train, val


def test_the_tool_writes_rows_and_names_a_bad_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.parquet as pq

    from quartet.environments.verifiers_env import VerifiersLoadError

    train, val = _data(tmp_path / "data", monkeypatch, capsys)
    got = pq.read_table(train).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in got] == ["pear", "plum", "lime", "kiwi"]
    assert {r["data_source"] for r in got} == {"env/verifiers/quartet-vf-multi"}
    assert {r["agent_name"] for r in got} == {"environment"} and pq.read_table(val).num_rows == 4
    with pytest.raises(VerifiersLoadError, match=r"'no-such-env'.*module 'no_such_env'.*PYTHONPATH"):
        _tool().main([str(tmp_path), "--env", "no-such-env"])
    with pytest.raises(SystemExit, match="--env-args 'nope' is not JSON"):
        _tool().main([str(tmp_path), "--env", "quartet-vf-multi", "--env-args", "nope"])


def test_two_grpo_steps_on_a_verifiers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    train, val = _data(tmp_path / "data", monkeypatch, capsys)
    overrides = [
        "cluster.backend=local",
        "model.tiny.hidden_size=64",
        "model.tiny.intermediate_size=128",
        "model.tiny.num_hidden_layers=2",
        f"data.train_files=[{train}]",
        f"data.val_files=[{val}]",
        "data.train_batch_size=2",
        "data.max_prompt_length=64",
        "data.max_response_length=64",
        "rollout.n=2",
        "rollout.multi_turn.enable=true",
        "rollout.multi_turn.max_assistant_turns=3",
        "algorithm.adv_estimator=grpo",
        "actor.mini_batch_size=2",
        "actor.micro_batch_size_per_device=4",
        "actor.logprobs.micro_batch_size_per_device=4",
        "trainer.total_steps=2",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "trainer.save_freq=0",
        "trainer.export_final=false",
        "trainer.rollout_freq=1",
        "trainer.loggers=[jsonl]",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")])}
    quartet = Path(sys.executable).parent / "quartet"
    proc = subprocess.run(
        [str(quartet), "train", *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (metrics,) = list((tmp_path / "run").rglob("metrics.jsonl"))
    steps = [s for s in map(json.loads, metrics.read_text().splitlines()) if s.get("kind") == "step"]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert math.isfinite(s["critic/score/mean"]) and 0.0 <= s["critic/score/mean"] <= 1.25
        assert s["env/errors/mean"] == 0.0 and s["reward/error_count"] == 0.0
        assert s["env/unrewarded/mean"] == 0.0  # every episode scored by the rubric
        assert 1.0 <= s["env/num_turns/mean"] <= 3.0  # verifiers' own monitor rubric, per episode
    records = [
        json.loads(line)
        for f in sorted((metrics.parent / "rollouts").glob("step_*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert len(records) == 8
    for rec in records:
        turns = [t for t in rec["turns"] if t["role"] == "assistant"]
        quick = 0.25 / len(turns)  # verifiers' rubric: found (0 or 1) + 0.25 * 1/turns
        assert rec["score"] == pytest.approx(rec["env_reward"])
        assert rec["score"] == pytest.approx(quick) or rec["score"] == pytest.approx(1.0 + quick)
