"""The vision benchmark's harness (benchmarks/vision.py): the verdict and summary over seeds, the table and
the plot, and that a seed is the vision demo's experiment (its settings and rows are the package's). The
SFT loop itself is tested in tests/demo/test_vision_sft.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import vision
from vision import CONTROL, GRPO, START, markdown_table, plot_seeds, summarise, verdict

import quartet.demo.vision as demo_vision


def _seed(seed: int, start: int, grpo: int, control: int, total: int = 200) -> dict[str, Any]:
    rows = {
        name: {"accuracy": c / total, "correct": c, "total": total, "train_s": 10.0 + seed}
        for name, c in ((START, start), (GRPO, grpo), (CONTROL, control))
    }
    return verdict(seed, rows) | {"wall_s": 100.0 * (seed + 1)}


def test_verdict_and_summary_follow_the_binomial_standard_error() -> None:
    win, tie = _seed(0, 80, 150, 100), _seed(1, 80, 104, 100)
    se = math.sqrt(0.75 * 0.25 / 200 + 0.5 * 0.5 / 200)
    assert win["grpo_minus_control"] == pytest.approx(0.25) and win["difference_se"] == pytest.approx(se)
    assert win["wins"] and win["improves"] and not tie["wins"] and tie["improves"]
    summary = summarise([win, tie])
    assert summary["wins"] == 1 and summary["improves"] == 2 and summary["seeds"] == 2
    assert summary["accuracy_mean"][GRPO] == pytest.approx((0.75 + 0.52) / 2)
    assert summary["wall_s_mean"] == pytest.approx(150.0)


def test_markdown_table_has_a_row_per_seed() -> None:
    table = markdown_table([_seed(0, 80, 150, 100), _seed(2, 10, 20, 30)]).splitlines()
    assert table[0].startswith("| seed | SFT start | GRPO | more SFT (control) | GRPO - control |")
    assert table[2].split(" | ")[:6] == ["| 0", "40.0%", "75.0%", "50.0%", "+25.0%", "4.7%"]
    assert table[3].split(" | ")[4] == "-5.0%" and table[3].endswith("| no | 12 | 300 |")


def test_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = plot_seeds([_seed(0, 80, 150, 100), _seed(1, 60, 90, 70)], tmp_path / "v.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_seed_runs_the_demos_experiment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`run_seed` hands `run_vision` the demo's config for the seed (`--smoke`: the demo's `--quick`, then the
    user's overrides) and the settings it was given, and tabulates the models it returns."""
    seen: dict[str, Any] = {}

    def fake_run(cfg: Any, s: Any, project: str, on_record: Any) -> Any:
        seen.update(cfg=cfg, s=s, project=project)
        models = [
            demo_vision.VisionModel(n, tmp_path, 10.0, 5, c, 40)
            for n, c in zip(demo_vision.ROWS, (8, 30, 20), strict=True)
        ]
        return models, tmp_path

    monkeypatch.setattr(demo_vision, "run_vision", fake_run)
    out = vision.run_seed(2, tmp_path, demo_vision.QUICK_SETTINGS, ["trainer.total_steps=7"], smoke=True)
    cfg = seen["cfg"]
    assert seen["s"] is demo_vision.QUICK_SETTINGS and seen["project"] == "seed2"
    assert cfg.data.builtin_task.value == "shapes" and cfg.trainer.total_steps == 7  # the override wins
    assert cfg.data.seed == cfg.sft.seed == cfg.model.tiny.seed == 2 and cfg.trainer.output_dir == str(
        tmp_path
    )
    assert cfg.data.builtin_val_size == 32  # the demo's --quick
    assert out["rows"][GRPO]["accuracy"] == 0.75 and out["grpo_minus_control"] == pytest.approx(0.25)
    assert (vision.START, vision.GRPO, vision.CONTROL) == demo_vision.ROWS == vision.MODELS
