"""A torn last line of metrics.jsonl (a write cut short) is dropped with a warning naming the file and the
bytes; any other bad line stops a resume with the file and line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from quartet.config import load_config
from quartet.tracking.jsonl_sink import JsonlSink, MetricsFileError, drop_torn_tail, read_records
from quartet.trainer.feed.run_files import prepare_metrics_file
from quartet.trainer.loop.rl_trainer import RLTrainer

GOOD = [{"kind": "step", "step": s, "time": 1.0, "loss": 0.5} for s in (1, 2, 3)]
TORN = '{"kind": "step", "step": 4, "time": 1.0, "lo'


def _write(path: Path, tail: str) -> str:
    text = "".join(json.dumps(r) + "\n" for r in GOOD)
    path.write_text(text + tail)
    return text


def test_torn_tail_is_dropped_with_a_warning_and_the_sink_appends_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "metrics.jsonl"
    complete = _write(path, TORN)
    with caplog.at_level(logging.WARNING, logger="quartet.tracking.jsonl_sink"):
        sink = JsonlSink(path)
    sink.log({"kind": "step", "step": 4, "time": 2.0})
    sink.close()
    assert path.read_text() == complete + '{"kind": "step", "step": 4, "time": 2.0}\n'
    (warning,) = [r.getMessage() for r in caplog.records]
    assert str(path) in warning and f"{len(TORN.encode())} bytes" in warning
    assert [r["step"] for r in read_records(path)] == [1, 2, 3, 4]


@pytest.mark.parametrize("tail", ["", "\n", "\n\n"])
def test_a_complete_file_is_left_alone(tmp_path: Path, tail: str) -> None:
    path = tmp_path / "metrics.jsonl"
    _write(path, tail)
    before = path.read_bytes()
    assert drop_torn_tail(path) == 0 and path.read_bytes() == before


def test_a_last_line_of_zeros_after_a_power_loss_is_torn_too(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    complete = _write(path, "\0" * 40 + "\n")
    assert drop_torn_tail(path) == 41 and path.read_text() == complete


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(r) for r in GOOD]
    lines.insert(1, TORN)
    path.write_text("\n".join(lines) + "\n")
    assert drop_torn_tail(path) == 0
    with pytest.raises(MetricsFileError, match=rf"{path}, line 2: not a JSON record"):
        read_records(path)


def test_resume_drops_a_torn_tail_and_supersedes_later_steps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = load_config(None, [f"trainer.output_dir={tmp_path}", "trainer.experiment_name=run"])
    trainer = RLTrainer(cfg)
    trainer.run_dir.mkdir(parents=True)
    _write(trainer.metrics_path, TORN)
    with caplog.at_level(logging.WARNING):
        prepare_metrics_file(trainer.metrics_path, resumed_step=2)
    assert [r["step"] for r in read_records(trainer.metrics_path)] == [1, 2]
    superseded = read_records(trainer.metrics_path.with_name("metrics.superseded.jsonl"))
    assert [r["step"] for r in superseded] == [3]
    assert any("torn last line" in r.getMessage() for r in caplog.records)

    lines = trainer.metrics_path.read_text().splitlines()
    trainer.metrics_path.write_text(lines[0] + "\n" + "{oops\n" + lines[1] + "\n")
    with pytest.raises(MetricsFileError, match="line 2"):
        prepare_metrics_file(trainer.metrics_path, resumed_step=2)
