"""`plot_run` and `quartet plot`: a real PNG from a metrics file written here with known values."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from quartet.cli.main import main
from quartet.tracking import TrackerUnavailableError
from quartet.tracking.plot import plot_run, read_curves

pytest.importorskip("matplotlib", reason="the tracking extra (matplotlib) is not installed")


def _write_run(run_dir: Path, steps: int = 6) -> None:
    lines = [
        {"kind": "data", "train": {"rows": 4}},
        {"kind": "val", "step": 0, "val-core/arith/reward/mean@1": 0.0},
    ]
    for s in range(1, steps + 1):
        lines.append(
            {
                "kind": "step",
                "step": s,
                "critic/score/mean": s / steps,
                "critic/score/min": 0.0,
                "critic/score/max": 1.0,
                "response_length/mean": 30.0 - s,
                "actor/ppo_kl": 1e-4 * s,
                "actor/entropy": 6.2 - 0.1 * s,
                "timing_s/gen": 1.0,
                "timing_s/update_actor": 0.5,
                "timing_s/step": 1.6,
            }
        )
    lines.append({"kind": "val", "step": steps, "val-core/arith/reward/mean@1": 0.5})
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "\n".join(json.dumps(rec) for rec in lines)
    (run_dir / "metrics.jsonl").write_text(
        text + "\n" + '{"kind": "step", "step": 7, "critic/sc'
    )  # killed mid-line


def _image_shape(path: Path) -> tuple[int, ...]:
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return tuple(matplotlib.image.imread(path).shape)


def test_curves_keep_the_last_record_of_a_step(tmp_path: Path) -> None:
    _write_run(tmp_path)
    with (tmp_path / "metrics.jsonl").open("a") as f:  # a resumed run replays step 6
        f.write('\n{"kind": "step", "step": 6, "critic/score/mean": 0.25}\n')
    curves = read_curves(tmp_path / "metrics.jsonl")
    steps, scores = curves.series("critic/score/mean")
    assert steps == [1, 2, 3, 4, 5, 6]
    assert scores == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 0.25])
    assert curves.series("val-core/arith/reward/mean@1", val=True) == ([0, 6], [0.0, 0.5])


def test_plot_writes_a_png(tmp_path: Path) -> None:
    _write_run(tmp_path)
    out = plot_run(tmp_path)
    assert out == tmp_path / "plots.png"
    height, width, channels = _image_shape(out)
    assert (height, width) == (1100, 1300) and channels in (3, 4)
    assert out.stat().st_size > 20_000  # five drawn panels, not a blank canvas


def test_missing_metrics_give_no_data_panels_not_errors(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "step", "step": 1, "other": 1.0}) + "\n")
    out = plot_run(tmp_path, tmp_path / "sub" / "p.png")
    assert _image_shape(out)[:2] == (1100, 1300)


def test_errors_name_the_path_and_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "metrics.jsonl")):
        plot_run(tmp_path)
    _write_run(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(
        TrackerUnavailableError,
        match=r"matplotlib package is not installed: pip install 'quartet\[tracking\]'",
    ):
        plot_run(tmp_path)


def test_cli_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_run(tmp_path / "run")
    assert main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "x.png")]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'x.png'}"
    assert _image_shape(tmp_path / "x.png")[:2] == (1100, 1300)
    assert main(["plot", str(tmp_path / "nope")]) == 1
    assert "no metrics file at" in capsys.readouterr().err
