"""What `quartet inspect` reads from a run folder: curves, recorded steps, samples, tokens, groups.

A run folder (`trainer.run_dir`) holds `metrics.jsonl` (the curves of `quartet plot`) and, with
`trainer.rollout_freq`, `rollouts/step_<N>.parquet` (the rollout tables; their file names and columns are
`quartet.tracking.run_layout`'s, shared with the trainer that writes them). Everything is read on demand
and again when a file changes, so the page of a live run shows new steps as they land. A step's
sample list reads only the scalar columns; one sample's tokens read one row group's token columns. A
vision-language run's samples name their images (`images`: `rollouts/images/<sha256>.<ext>`); `image_file`
resolves such a name to its file, and to nothing outside the run's images folder.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from quartet.tracking.plot import ENTROPY, KL_KEYS, LENGTH, SCORE, STEP_TIME, read_curves
from quartet.tracking.run_layout import (
    IMAGE_TYPES,
    METRICS_FILE,
    ROLLOUT_IMAGES_DIR,
    ROLLOUT_TABLE_GLOB,
    ROLLOUTS_DIR,
    TOKEN_COLUMNS,
    TOKEN_LIST_COLUMNS,
    rollout_image_name,
    rollout_table_file,
    rollout_table_step,
)

__all__ = ["SAMPLE_COLUMNS", "RunData", "RunNotFoundError", "SampleFilter"]

SAMPLE_COLUMNS = (
    "row",
    "uid",
    "data_source",
    "index",
    "prompt",
    "response",
    "prompt_tokens",
    "response_tokens",
    "finish_reason",
    "score",
    "reward",
    "advantage",
    "truncated",
    "num_turns",
    "tool_calls",
    "tool_errors",
    "drift",
    "tokens_dropped",
)
"""The scalar columns of a step's sample list (the per-token lists are read per sample)."""

_CACHED_STEPS = 64
_SORTABLE = {
    "row",
    "score",
    "reward",
    "advantage",
    "response_tokens",
    "prompt_tokens",
    "drift",
    "tool_errors",
}


class RunNotFoundError(FileNotFoundError):
    """The folder is not a run folder `quartet inspect` can read."""


@dataclass(frozen=True)
class SampleFilter:
    """Which samples of a step to list, and in which order."""

    text: str = ""
    """Case-insensitive substring of the prompt or the response."""
    min_score: float | None = None
    max_score: float | None = None
    truncated: bool | None = None
    min_drift: float | None = None
    data_source: str = ""
    tool_errors: bool | None = None
    """True: only samples with a failed tool call; False: only those without."""
    sort: str = "row"
    descending: bool = False
    offset: int = 0
    limit: int = 200


@dataclass
class RunData:
    """A run folder, read lazily; cached tables are dropped when their file changes."""

    path: Path
    name: str = ""
    _cache: dict[Path, tuple[float, pa.Table]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path).resolve()
        if not self.path.is_dir():
            raise RunNotFoundError(f"no run folder at {self.path}")
        if not (self.path / METRICS_FILE).is_file() and not (self.path / ROLLOUTS_DIR).is_dir():
            raise RunNotFoundError(
                f"{self.path} is not a run folder: it has neither {METRICS_FILE} nor rollouts/. "
                "Pass the folder a run wrote (trainer.output_dir/project_name/experiment_name; "
                "`quartet demo` prints it)"
            )
        self.name = self.name or self.path.name

    # ---- curves -----------------------------------------------------------------------------------------

    def curves(self) -> dict[str, Any]:
        """The panels of `quartet plot` as {panel: {metric: [[step, value], ...]}}, and every metric."""
        file = self.path / METRICS_FILE
        if not file.is_file():
            return {"panels": {}, "metrics": {}}
        curves = read_curves(file)
        everything = {key: _points(*curves.series(key)) for key in curves.names()}
        vals = {
            key: _points(*curves.series(key, val=True))
            for key in curves.names(val=True)
            if key.startswith("val-core/") and "/reward/mean@" in key
        }

        def pick(keys: list[str] | tuple[str, ...]) -> dict[str, list[list[float]]]:
            return {k: everything[k] for k in keys if k in everything}

        timing = [k for k in everything if k.startswith("timing_s/") and k != STEP_TIME]
        panels = {
            "score": pick([SCORE, SCORE.replace("/mean", "/min"), SCORE.replace("/mean", "/max")]) | vals,
            "response length": pick([LENGTH]),
            "KL": pick(KL_KEYS),
            "entropy": pick([ENTROPY]),
            "time per phase": pick([*timing, STEP_TIME]),
        }
        return {"panels": panels, "metrics": everything}

    # ---- steps and samples ------------------------------------------------------------------------------

    def alarms(self) -> list[dict[str, Any]]:
        """The run's alarm records (`trainer.mismatch_alarm` or `trainer.no_signal_steps` tripped), in the
        order written: step, alarm (`mismatch`, `no_signal`), phase, value, threshold (the mismatch alarm's;
        None for the no-signal alarm), message. A line being written is skipped until it is complete."""
        file = self.path / METRICS_FILE
        out: list[dict[str, Any]] = []
        for line in file.read_text().splitlines() if file.is_file() else []:
            if '"alarm"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("kind") == "alarm":
                keys = {"value": "alarm/mismatch_value", "threshold": "alarm/mismatch_threshold"}
                keys |= {key: key for key in ("step", "alarm", "phase", "message")}
                out.append(_clean({name: rec.get(key) for name, key in keys.items()}))
        return out

    def steps(self) -> list[dict[str, Any]]:
        """Recorded steps, in order: step, samples, whether the per-token values are there, and the phase of
        the step's alarm (None: none tripped)."""
        folder = self.path / ROLLOUTS_DIR
        alarmed = {a["step"]: a["phase"] for a in self.alarms()}
        out = []
        for file in sorted(folder.glob(ROLLOUT_TABLE_GLOB)) if folder.is_dir() else []:
            step = rollout_table_step(file.name)
            if step is None:
                continue
            meta = pq.read_metadata(file)
            names = set(meta.schema.to_arrow_schema().names)
            tokens = "token_ids" in names
            out.append({"step": step, "samples": meta.num_rows, "tokens": tokens, "alarm": alarmed.get(step)})
        return sorted(out, key=lambda s: s["step"])

    def _table(self, step: int, columns: tuple[str, ...] | None = None) -> pa.Table:
        file = self.path / ROLLOUTS_DIR / rollout_table_file(step)
        if not file.is_file():
            have = ", ".join(str(s["step"]) for s in self.steps()) or "none"
            raise KeyError(f"run {self.name}: no recorded step {step} (recorded steps: {have})")
        if columns is not None:  # scalar columns: cached, the list is filtered and sorted again and again
            mtime = file.stat().st_mtime
            cached = self._cache.get(file)
            if cached is None or cached[0] != mtime:
                present = pq.read_schema(file).names
                cached = (mtime, pq.read_table(file, columns=[c for c in columns if c in present]))
                while len(self._cache) >= _CACHED_STEPS:  # the oldest first: a long run stays bounded
                    self._cache.pop(next(iter(self._cache)))
                self._cache[file] = cached
            return cached[1]
        return pq.read_table(file)

    def samples(self, step: int, flt: SampleFilter) -> dict[str, Any]:
        """One page of a step's samples after `flt`: {total, matched, rows: [...], sources: [...]}."""
        table = self._table(step, SAMPLE_COLUMNS)
        keep = pa.array([True] * table.num_rows)
        if flt.text:
            needle = flt.text
            hits = pc.or_(
                pc.match_substring(table["prompt"], needle, ignore_case=True),
                pc.match_substring(table["response"], needle, ignore_case=True),
            )
            keep = pc.and_(keep, hits)
        if flt.min_score is not None:
            keep = pc.and_(keep, pc.greater_equal(table["score"], flt.min_score))
        if flt.max_score is not None:
            keep = pc.and_(keep, pc.less_equal(table["score"], flt.max_score))
        if flt.truncated is not None:
            keep = pc.and_(keep, pc.equal(table["truncated"], flt.truncated))
        if flt.min_drift is not None:
            keep = pc.and_(keep, pc.greater_equal(table["drift"], flt.min_drift))
        if flt.data_source:
            keep = pc.and_(keep, pc.equal(table["data_source"], flt.data_source))
        if flt.tool_errors is not None and "tool_errors" in table.column_names:
            failed = pc.greater(pc.fill_null(table["tool_errors"], 0.0), 0.0)
            keep = pc.and_(keep, failed if flt.tool_errors else pc.invert(failed))
        chosen = table.filter(pc.fill_null(keep, False))
        if flt.sort not in _SORTABLE:
            raise ValueError(f"cannot sort by {flt.sort!r}; sortable: {', '.join(sorted(_SORTABLE))}")
        if flt.sort in chosen.column_names:
            order = "descending" if flt.descending else "ascending"
            chosen = chosen.sort_by([(flt.sort, order), ("row", "ascending")])
        page = chosen.slice(flt.offset, flt.limit).to_pylist()
        for row in page:
            row["prompt"] = _preview(row["prompt"], 160)
            row["response"] = _preview(row["response"], 240)
        return {
            "step": step,
            "total": table.num_rows,
            "matched": chosen.num_rows,
            "rows": [_clean(r) for r in page],
            "sources": sorted(set(table["data_source"].to_pylist())),
        }

    def sample(self, step: int, row: int) -> dict[str, Any]:
        """One sample in full: its scalars, its turns and, per token, every recorded value."""
        table = self._table(step)
        if not 0 <= row < table.num_rows:
            raise KeyError(f"run {self.name}, step {step}: no row {row} (it has {table.num_rows})")
        rec = table.slice(row, 1).to_pylist()[0]
        tokens = [name for name in (*TOKEN_LIST_COLUMNS, *TOKEN_COLUMNS) if rec.get(name) is not None]
        out = {k: v for k, v in rec.items() if k not in tokens}
        out["turns"] = json.loads(out.get("turns") or "[]")
        out["token_fields"] = [name for name in TOKEN_COLUMNS if name in tokens]
        out["tokens"] = _token_rows(rec, tokens)
        if "logprobs" in tokens and "rollout_logprobs" in tokens:
            out["token_fields"].append("logprob_diff")
            for tok in out["tokens"]:
                tok["logprob_diff"] = tok["rollout_logprobs"] - tok["logprobs"]
        cleaned: dict[str, Any] = _clean(out)
        return cleaned

    def group(self, step: int, uid: str) -> list[dict[str, Any]]:
        """The samples of one prompt (same `uid`) at `step`, with full texts, in row order."""
        table = self._table(step, SAMPLE_COLUMNS)
        chosen = table.filter(pc.equal(table["uid"], uid))
        if chosen.num_rows == 0:
            raise KeyError(f"run {self.name}, step {step}: no group {uid!r}")
        full = pq.read_table(self.path / ROLLOUTS_DIR / rollout_table_file(step), columns=["row", "response"])
        responses = dict(zip(full["row"].to_pylist(), full["response"].to_pylist(), strict=True))
        rows = chosen.sort_by("row").to_pylist()
        for r in rows:
            r["response"] = responses[r["row"]]
        return [_clean(r) for r in rows]

    def image_file(self, path: str) -> tuple[Path, str]:
        """(file, content type) of a sample's image named by its record (`rollouts/images/<sha256>.<ext>`).

        ValueError for any other form of path (`..`, absolute, another folder, another name); KeyError when
        no such file is in the run's images folder, or when the name leads out of it (a symlink).
        """
        name = rollout_image_name(path)
        if name is None:
            raise ValueError(
                f"image path must be {ROLLOUTS_DIR}/{ROLLOUT_IMAGES_DIR}/<sha256>.<ext> as a record names "
                f"it, got {path[:200]!r}"
            )
        folder = (self.path / ROLLOUTS_DIR / ROLLOUT_IMAGES_DIR).resolve()
        file = (folder / name).resolve()
        if not folder.is_relative_to(self.path) or file.parent != folder or not file.is_file():
            raise KeyError(f"run {self.name}: no image {name}")
        return file, IMAGE_TYPES[name.rsplit(".", 1)[1]]

    def find_prompt(self, prompt: str, index: int | None = None) -> list[dict[str, Any]]:
        """Every recorded sample of the same prompt (by dataset `index` when both have one, else by text)."""
        out = []
        for info in self.steps():
            table = self._table(info["step"], SAMPLE_COLUMNS)
            if (
                index is not None
                and "index" in table.column_names
                and table["index"].null_count < table.num_rows
            ):
                hits = pc.equal(table["index"], index)
            else:
                hits = pc.equal(table["prompt"], prompt)
            for r in table.filter(pc.fill_null(hits, False)).to_pylist():
                out.append(_clean({"step": info["step"], **r}))
        return out


def _points(steps: list[int], values: list[float]) -> list[list[float]]:
    return [[s, v] for s, v in zip(steps, values, strict=True) if math.isfinite(v)]


def _token_rows(rec: dict[str, Any], names: list[str]) -> list[dict[str, Any]]:
    count = len(rec.get("token_ids") or [])
    return [{name: rec[name][i] for name in names if i < len(rec[name])} for i in range(count)]


def _preview(text: str | None, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit] + "…"


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value
