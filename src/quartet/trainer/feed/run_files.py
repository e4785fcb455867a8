"""The run folder's record files the driver keeps besides checkpoints: `metrics.jsonl` made ready for this
process (resume or fresh start) and `bad_rows.jsonl` (every row skipped at load or scored 0 by a failed
score call, named with file, row and reason)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from quartet.data.bad_rows import BadRow, append_bad_rows, replace_load_rows
from quartet.data.prompts import PromptDataset
from quartet.tracking.jsonl_sink import drop_torn_tail, read_records
from quartet.tracking.run_layout import BAD_ROWS_FILE, SUPERSEDED_METRICS_FILE, set_aside_metrics_file
from quartet.trainer.feed.rl_data import RLData

__all__ = ["name_bad_rows", "name_reward_failures", "prepare_metrics_file"]

log = logging.getLogger(__name__)


def prepare_metrics_file(metrics_path: Path, resumed_step: int | None) -> None:
    """metrics.jsonl for this process: on resume, records past the checkpoint's step (written after it by
    the interrupted run, and about to be redone) move to metrics.superseded.jsonl; on a fresh start an
    old file is renamed aside. Nothing is deleted."""
    if not metrics_path.exists():
        return
    if resumed_step is None:
        aside = metrics_path.with_name(set_aside_metrics_file(int(time.time())))
        metrics_path.rename(aside)
        log.warning("a fresh start: the earlier %s was renamed %s", metrics_path.name, aside.name)
        return
    drop_torn_tail(metrics_path)  # a write cut short by a crash: dropped with a warning
    keep: list[str] = []
    superseded: list[str] = []
    for rec in read_records(metrics_path):  # any other bad line: an error naming file and line
        later = rec.get("kind") in ("step", "val", "checkpoint") and rec.get("step", 0) > resumed_step
        (superseded if later else keep).append(json.dumps(rec))
    if superseded:
        with metrics_path.with_name(SUPERSEDED_METRICS_FILE).open("a") as f:
            f.write("\n".join(superseded) + "\n")
    metrics_path.write_text("".join(line + "\n" for line in keep))


def name_bad_rows(run_dir: Path, data: RLData) -> str | None:
    """Every skipped, over-long or cut row of the data sets into `bad_rows.jsonl`; its path (None when
    no row was), and one warning line with the counts."""
    bad = data.train.report.bad + (data.val.report.bad if data.val else [])
    path = run_dir / BAD_ROWS_FILE
    replace_load_rows(path, bad)
    if not bad:
        return None
    counts: dict[str, int] = {}
    for row in bad:
        counts[row.reason] = counts.get(row.reason, 0) + 1
    log.warning("%d rows skipped, dropped or cut at load %s: each is named in %s", len(bad), counts, path)
    return str(path)


def name_reward_failures(run_dir: Path, reward: Any, dataset: PromptDataset, step: int) -> None:
    """The responses whose score call failed (scored 0) since the last look, by dataset row, appended
    to `bad_rows.jsonl`, with one warning naming the rows and the file."""
    failures = reward.take_failures()
    if not failures:
        return
    bad = []
    for f in failures:
        src = dataset.source(f.row) if f.row is not None and 0 <= f.row < len(dataset) else None
        file, row, line = (src.file, src.row, src.line) if src else ("(unknown)", None, None)
        bad.append(BadRow("reward", file, row, "reward", f.status, f.reason, line=line, step=step))
    path = run_dir / BAD_ROWS_FILE
    append_bad_rows(path, bad)
    where = sorted({f"{Path(b.file).name}:{b.row}" for b in bad})
    log.warning(
        "step %d: %d responses scored 0 because their score call failed (rows %s%s; first: %s); "
        "each is named in %s",
        step,
        len(bad),
        ", ".join(where[:10]),
        ", ..." if len(where) > 10 else "",
        bad[0].message,
        path,
    )
