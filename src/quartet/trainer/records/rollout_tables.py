"""Rollout tables: one parquet file per recorded step with every sample's per-token values.

Written next to the JSONL rollout records (`quartet.trainer.records.rollout_records`) when
`trainer.rollout_freq` says a step is recorded and `trainer.rollout_tokens` is on; `quartet inspect` reads
them. One row per sample (the same rows as the JSONL), columns:

- scalars: `step`, `row`, `uid`, `data_source`, `index`, `prompt`, `response`, `prompt_tokens`,
  `response_tokens`, `finish_reason`, `ground_truth` (JSON text), `score`, `reward`, `advantage` (first
  model token), `truncated`, `num_turns`, `tool_calls`, `tool_errors`, `drift` (mean |engine - trainer|
  log-prob over model tokens; null without engine log-probs), `turns` (JSON text: role, start, stop),
  `images` (vision-language batches only: the sample's image paths relative to the run folder);
- per response token (lists, one entry per token up to the response's length): `token_ids`, `token_text`
  (each token decoded alone), `mask` (1: model-written, in the loss), and, where the step computed them,
  `logprobs` (the trainer's old log-probs), `rollout_logprobs` (the engine's), `ref_logprobs`, `entropy`,
  `advantages`, `values`, `versions` (the weight version that wrote the token).

The file names and the per-token column list are `quartet.tracking.run_layout`'s, which the inspector
reads too. The file is written to a temporary name and renamed, so a reader (the page of a live run) never
sees half a file. `trainer.rollout_budget_mb` bounds the run's total: past it a step is written without
the per-token columns, and `tokens_dropped` is true in its rows.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from quartet.core.batch import Batch
from quartet.tracking.run_layout import ROLLOUT_TABLE_GLOB, TOKEN_COLUMNS, rollout_table_file

__all__ = ["TokenTableWriter", "rollout_table", "turn_spans"]

log = logging.getLogger(__name__)
ImagePaths = list[list[str]] | None
"""Each row's stored image paths (`quartet.trainer.records.rollout_images.ImageStore.paths`), or None."""


def _plain_json(value: Any) -> str | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    return json.dumps(value, ensure_ascii=False, default=str)


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, stop) of the runs of equal values in `mask`."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


def turn_spans(batch: Batch, row: int, mask: list[int], length: int) -> list[tuple[str, int, int]] | None:
    """The row's turns as (role, start, stop): the agent loop's own (`turn_spans`: assistant, tool, user),
    else runs of the mask (assistant / environment); None for a one-turn response."""
    spans = batch.non_tensors["turn_spans"][row] if "turn_spans" in batch.non_tensors else None
    if spans:
        cut = [(str(role), int(a), min(int(b), length)) for role, a, b in spans if int(a) < length]
        return [span for span in cut if span[2] > span[1]]
    if 0 not in mask or not length:
        return None
    return [("assistant" if value else "environment", a, b) for value, a, b in _runs(mask)]


def _turns(batch: Batch, row: int, mask: list[int], length: int) -> list[dict[str, Any]]:
    """The row's turns as the JSONL records cut them (`turn_spans`), one assistant turn for a one-turn
    response."""
    spans = turn_spans(batch, row, mask, length) or ([("assistant", 0, length)] if length else [])
    return [{"role": r, "start": a, "stop": b} for r, a, b in spans]


def _agent_counter(batch: Batch, row: int, key: str) -> float | None:
    if "agent_metrics" not in batch.non_tensors:
        return None
    metrics = batch.non_tensors["agent_metrics"][row] or {}
    return float(metrics.get(key, 0.0))


def rollout_table(
    batch: Batch, tokenizer: Any, step: int, limit: int = 0, tokens: bool = True, images: ImagePaths = None
) -> pa.Table:
    """The table of the first `limit` rows (0: all) of a trained batch; `tokens=False` leaves out the
    per-token columns (`tokens_dropped` then says so); `images`: each row's stored image paths."""
    n = len(batch) if limit <= 0 else min(limit, len(batch))
    width = batch["prompts"].shape[1]
    attention = batch["attention_mask"][:n]
    lengths = (attention[:, width:] != 0).sum(-1).tolist()
    prompt_rows = [batch["prompts"][i][attention[i, :width] != 0].tolist() for i in range(n)]
    response_rows = [batch["responses"][i][: lengths[i]].tolist() for i in range(n)]
    masks = [batch["response_mask"][i][: lengths[i]].tolist() for i in range(n)]
    nt = batch.non_tensors
    cols: dict[str, list[Any]] = {
        "step": [step] * n,
        "row": list(range(n)),
        "uid": [str(nt["uid"][i]) if "uid" in nt else str(i) for i in range(n)],
        "data_source": [str(nt["data_source"][i]) if "data_source" in nt else "" for i in range(n)],
        "index": [_as_index(nt["index"][i]) if "index" in nt else None for i in range(n)],
        "prompt": tokenizer.batch_decode(prompt_rows),
        "response": tokenizer.batch_decode(response_rows),
        "prompt_tokens": [len(p) for p in prompt_rows],
        "response_tokens": lengths,
        "finish_reason": [str(nt["finish_reason"][i]) if "finish_reason" in nt else "" for i in range(n)],
        "ground_truth": [
            _plain_json(nt["ground_truth"][i]) if "ground_truth" in nt else None for i in range(n)
        ],
        "score": _row_values(batch, "scores", n),
        "reward": [float(v) for v in batch["token_level_rewards"][:n].sum(-1)]
        if "token_level_rewards" in batch
        else [None] * n,
        "advantage": [_first_model_value(batch, "advantages", i, masks[i]) for i in range(n)],
        "num_turns": [_agent_counter(batch, i, "agent/assistant_turns") for i in range(n)],
        "tool_calls": [_agent_counter(batch, i, "tool/calls") for i in range(n)],
        "tool_errors": [_agent_counter(batch, i, "tool/failed") for i in range(n)],
        "drift": _drift(batch, n, lengths),
        "turns": [json.dumps(_turns(batch, i, masks[i], lengths[i])) for i in range(n)],
        "tokens_dropped": [not tokens] * n,
    }
    if images is not None:
        cols["images"] = images[:n]
    reasons = cols["finish_reason"]
    cols["truncated"] = [r in ("length", "max_tokens", "truncated") for r in reasons]
    if tokens:
        cols["token_ids"] = response_rows
        pieces: dict[int, str] = {}  # each distinct id decoded once
        for ids in response_rows:
            for t in ids:
                if t not in pieces:
                    pieces[t] = tokenizer.decode([t])
        cols["token_text"] = [[pieces[t] for t in ids] for ids in response_rows]
        cols["mask"] = masks
        for name, source in TOKEN_COLUMNS.items():
            if source in batch:
                values = batch[source][:n].float()
                cols[name] = [values[i, : lengths[i]].tolist() for i in range(n)]
    return pa.table(_typed(cols))


def _typed(cols: dict[str, list[Any]]) -> dict[str, pa.Array]:
    """Compact types: int32 ids, int8 masks, float32 values."""
    types = {
        "step": pa.int32(),
        "row": pa.int32(),
        "index": pa.int64(),
        "prompt_tokens": pa.int32(),
        "response_tokens": pa.int32(),
        "token_ids": pa.list_(pa.int32()),
        "mask": pa.list_(pa.int8()),
        "images": pa.list_(pa.string()),
        **{name: pa.list_(pa.float32()) for name in TOKEN_COLUMNS},
    }
    return {k: pa.array(v, type=types.get(k)) for k, v in cols.items()}


def _as_index(value: Any) -> int | None:
    """A dataset row number, or None where the data's `index` is not an integer (it is the user's column)."""
    try:
        return int(value) if value is not None and float(value) == int(value) else None
    except (TypeError, ValueError, OverflowError):
        return None


def _row_values(batch: Batch, key: str, n: int) -> list[float | None]:
    return [float(v) for v in batch[key][:n]] if key in batch else [None] * n


def _first_model_value(batch: Batch, key: str, row: int, mask: list[int]) -> float | None:
    if key not in batch or not mask:
        return None
    first = mask.index(1) if 1 in mask else 0
    return float(batch[key][row][first])


def _drift(batch: Batch, n: int, lengths: list[int]) -> list[float | None]:
    """Mean |engine - trainer| log-prob over each row's model tokens (null without both)."""
    if "rollout_logprobs" not in batch or "old_logprobs" not in batch:
        return [None] * n
    diff = (batch["rollout_logprobs"][:n].double() - batch["old_logprobs"][:n].double()).abs()
    mask = batch["response_mask"][:n].double()
    per_row = (diff * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return [float(v) if lengths[i] else None for i, v in enumerate(per_row)]


class TokenTableWriter:
    """Writes `rollouts/step_<N>.parquet` for recorded steps within a total size budget."""

    def __init__(self, folder: Path, tokenizer: Any, limit: int, budget_mb: float) -> None:
        self.folder = folder
        self.tokenizer = tokenizer
        self.limit = limit
        self.budget_bytes = int(budget_mb * 2**20)
        tables = folder.glob(ROLLOUT_TABLE_GLOB) if folder.is_dir() else ()
        self.written = sum(p.stat().st_size for p in tables)
        self.warned = False

    def write(self, batch: Batch, step: int, images: ImagePaths = None) -> Path:
        """Write the step's table (atomically); without per-token columns once the budget is spent."""
        tokens = self.written < self.budget_bytes
        if not tokens and not self.warned:
            log.warning(
                "rollout tables reached trainer.rollout_budget_mb (%.0f MB): step %d and later are written "
                "without per-token values; raise the budget to keep them",
                self.budget_bytes / 2**20,
                step,
            )
            self.warned = True
        table = rollout_table(batch, self.tokenizer, step, self.limit, tokens=tokens, images=images)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / rollout_table_file(step)
        tmp = path.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
        self.written += path.stat().st_size
        return path
