"""`quartet sft` as a user runs it: a few steps end to end, and config errors exit with status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quartet.cli.main import main


@pytest.mark.slow
def test_cli_runs_a_few_steps_end_to_end(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "quartet.cli.main",
            "sft",
            f"trainer.output_dir={tmp_path}",
            "trainer.experiment_name=cli",
            "cluster.backend=local",
            "sft.max_steps=4",
            "sft.eval_samples=4",
            "--log-every=2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sft done" in out.stdout and "accuracy" in out.stdout and "step     4" in out.stdout
    run_dir = tmp_path / "quartet" / "cli"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all({"loss", "lr", "grad_norm", "tokens"} <= r.keys() for r in steps)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run_dir / "hf", local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf", local_files_only=True)
    assert model.config.vocab_size >= len(tokenizer) and tokenizer.chat_template


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("sft.optim.lrr=1", "sft.optim.lrr"),
        ("sft.batch_size=0", "sft.batch_size"),
        ("sft.micro_batch_size_per_device=5", "sft.micro_batch_size_per_device"),
        ("sft.builtin.val_size=60", "sft.builtin.val_size"),
    ],
)
def test_config_errors_exit_2(override: str, field: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sft", override]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and field in err
