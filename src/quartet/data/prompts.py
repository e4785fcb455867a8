"""RL prompts in verl's dataset layout, tokenized once at load, served as left-padded `Batch`es.

Row layout (verl's `RLHFDataset`; column names are config keys):
    prompt        list of chat messages {role, content} (`data.prompt_key`): roles of OpenAI's chat
                  (`CHAT_ROLES`), text in each (a tool result, or an assistant turn with `tool_calls`, may be
                  empty), and more than system messages
    data_source   which rule scorer grades the row (`data.data_source_key`)
    reward_model  {"ground_truth": ..., "style": "rule"}; the ground truth is found by the dotted
                  `data.ground_truth_key` and handed on as a string (JSON for lists and objects)
    extra_info    optional dict (index, split, tools_kwargs, interaction_kwargs, ...), handed on as is
    agent_name    optional: which agent loop runs the row

Each prompt is rendered with the tokenizer's chat template (`add_generation_prompt=True`) once, at load, so
a template failure, an over-long prompt or a malformed row is reported before any actor starts, and the
time it took is in the report. Over-long prompts are dropped, cut to their last `max_prompt_length` tokens
(the question's end and the generation prompt survive), or stop the load, as `data.overlong_prompt` says;
every dropped or cut row is counted. A malformed row (its columns are checked in `prompt_rows`) raises
`DataError` naming file, row, column and the fix, or with `data.skip_bad_rows` is counted under its reason
and logged once with the first example; every skipped, dropped or cut row is kept in `DatasetReport.bad`
(the trainer writes them to `bad_rows.jsonl`).

`check_source` (given by the trainer when the built-in rule scorers grade the rows) checks each row's
`data_source` at load: a row no scorer knows is a bad row here, not a crash when it is first drawn.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quartet.config.data import DataConfig, OverlongPrompt
from quartet.core.batch import Batch
from quartet.data.errors import DataError, RowProblem
from quartet.data.images import ImageInputs, expand_image_tokens, row_images
from quartet.data.prompt_rows import CHAT_ROLES, CheckedRow, check_row, parse_messages
from quartet.data.reading import RowSource, SourcedRow, read_files
from quartet.data.report import DatasetReport

__all__ = ["CHAT_ROLES", "DatasetReport", "PromptDataset", "parse_messages", "pad_token_id"]

log = logging.getLogger(__name__)
_SKIP_HINT = "or set data.skip_bad_rows=true to count and skip such rows"


def _render(
    tokenizer: Any, messages: list[dict[str, Any]], column: str, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    try:
        ids = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    except Exception as err:  # the model's own jinja template failing: report it with the row
        raise RowProblem(
            "template_failed", column, f"the chat template failed: {type(err).__name__}: {err}"
        ) from err
    return [int(t) for t in ids]


def _prepare(
    sourced: SourcedRow,
    cfg: DataConfig,
    tokenizer: Any,
    tools: Sequence[Mapping[str, Any]] | None,
    check_source: Callable[[str], None] | None,
    images: ImageInputs | None,
) -> tuple[CheckedRow, list[int]]:
    """A row checked and its prompt tokens (each image's tokens expanded); raises `RowProblem`."""
    if isinstance(sourced.value, RowProblem):
        raise sourced.value
    row = check_row(sourced.value, cfg)
    if check_source is not None:
        check_source(row.data_source)
    base = Path(sourced.source.file).parent
    shown, blobs, counts = row_images(sourced.value, row.messages, images, base, cfg.prompt_key)
    tokens = _render(tokenizer, shown, cfg.prompt_key, [dict(t) for t in tools or ()] or None)
    if images is not None and blobs:
        tokens = expand_image_tokens(tokens, images.image_token_id, counts, cfg.prompt_key)
        row = dataclasses.replace(row, images=tuple(blobs))
    return row, tokens


def pad_token_id(tokenizer: Any) -> int:
    """The id prompts are padded with: the pad token, else the end-of-sequence token (as verl does)."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(candidate, int):
            return candidate
    raise DataError("tokenizer", "has neither a pad token nor an end-of-sequence token to pad prompts with")


# ---- the dataset -----------------------------------------------------------------------------------------


class PromptDataset:
    """Tokenized prompts with their scoring data; `batch(indices)` gives the rollout's input `Batch`."""

    def __init__(
        self,
        rows: Sequence[CheckedRow],
        ids: Sequence[Sequence[int]],
        sources: Sequence[RowSource],
        pad_id: int,
        report: DatasetReport,
        images: ImageInputs | None = None,
    ) -> None:
        """Use `from_files` or `from_rows`."""
        self.images = images
        """Makes a batch's pixels; None for a text-only model."""
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        self._offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # One flat array instead of a list of lists: a million prompts cost 4 bytes a token, not ~36.
        flat = [t for x in ids for t in x]
        self._ids = np.asarray(flat, dtype=np.int32) if flat else np.zeros(0, np.int32)
        self._rows = list(rows)
        self._sources = list(sources)
        self.pad_id = pad_id
        self.report = report
        self.has_agent_name = any(r.agent_name is not None for r in self._rows)

    @classmethod
    def from_files(
        cls,
        files: Sequence[str],
        cfg: DataConfig,
        tokenizer: Any,
        tools: Sequence[Mapping[str, Any]] | None = None,
        check_source: Callable[[str], None] | None = None,
        images: ImageInputs | None = None,
    ) -> PromptDataset:
        """Load parquet / JSONL files or saved `datasets` folders (concatenated, in order).

        tools: the OpenAI tool schemas an agent loop renders into every prompt (multi-turn runs), so that
        prompt lengths are measured as the model will see them.
        check_source: called with each row's data_source; raises `RowProblem` for one that cannot be
            scored (the row is then refused, or skipped with `data.skip_bad_rows`).
        images: a vision-language model's image processor and image token: rows may then hold images
            (`quartet.data.images`); their prompt lengths count each image's tokens.
        """
        if not files:
            raise DataError("(no files)", "no data files were given", fix="set data.train_files=[...]")
        names = tuple(str(f) for f in files)
        return cls._load(read_files(files), cfg, tokenizer, names, tools, check_source, images)

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[Mapping[str, Any]],
        cfg: DataConfig,
        tokenizer: Any,
        source_name: str,
        tools: Sequence[Mapping[str, Any]] | None = None,
        check_source: Callable[[str], None] | None = None,
        images: ImageInputs | None = None,
    ) -> PromptDataset:
        """Load rows already in memory; `source_name` stands in for the file in messages (image paths are
        read relative to its folder)."""
        sourced = (SourcedRow(RowSource(source_name, i), _as_row(r)) for i, r in enumerate(rows))
        return cls._load(sourced, cfg, tokenizer, (source_name,), tools, check_source, images)

    @classmethod
    def _load(
        cls,
        rows: Iterable[SourcedRow],
        cfg: DataConfig,
        tokenizer: Any,
        files: tuple[str, ...],
        tools: Sequence[Mapping[str, Any]] | None = None,
        check_source: Callable[[str], None] | None = None,
        images: ImageInputs | None = None,
    ) -> PromptDataset:
        start = time.perf_counter()
        pad_id = pad_token_id(tokenizer)
        report = DatasetReport(files=files)
        kept: list[CheckedRow] = []
        ids: list[list[int]] = []
        sources: list[RowSource] = []
        limit = cfg.max_prompt_length
        for sourced in rows:
            report.rows += 1
            try:
                row, tokens = _prepare(sourced, cfg, tokenizer, tools, check_source, images)
            except RowProblem as problem:
                if not cfg.skip_bad_rows:
                    raise sourced.source.error(problem, hint=_SKIP_HINT) from None
                report._count_bad(sourced.source.error(problem), problem.reason)
                continue
            if len(tokens) > limit:
                overlong = sourced.source.error(_overlong(len(tokens), limit, cfg.prompt_key))
                if cfg.overlong_prompt is OverlongPrompt.ERROR:
                    raise overlong
                if cfg.overlong_prompt is OverlongPrompt.FILTER or row.images:  # cutting loses image tokens
                    report.filtered_overlong += 1
                    report._name(overlong, "overlong_filtered")
                    continue
                tokens = tokens[-limit:]
                report.truncated += 1
                report._name(overlong, "overlong_truncated")
            kept.append(row)
            ids.append(tokens)
            sources.append(sourced.source)
            report.longest_prompt = max(report.longest_prompt, len(tokens))
        report.loaded = len(kept)
        report.seconds = time.perf_counter() - start
        _log_report(report)
        if not kept:
            raise DataError(
                ", ".join(files),
                f"no usable rows: {report.summary()}",
                fix=_empty_fix(report, cfg),
            )
        return cls(kept, ids, sources, pad_id, report, images)

    # ---- access -----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._rows)

    def prompt_ids(self, index: int) -> list[int]:
        """The rendered prompt of row `index` (after any truncation)."""
        self._check_index(index)
        return [int(t) for t in self._ids[self._offsets[index] : self._offsets[index + 1]]]

    def source(self, index: int) -> RowSource:
        """Where row `index` came from (file, row), for messages about it found later."""
        self._check_index(index)
        return self._sources[index]

    def row(self, index: int) -> dict[str, Any]:
        """Row `index`'s non-tensor fields (data_source, ground_truth, extra_info, raw_prompt, agent_name)."""
        self._check_index(index)
        r = self._rows[index]
        return {
            "data_source": r.data_source,
            "ground_truth": r.ground_truth,
            "extra_info": r.extra_info,
            "raw_prompt": r.messages,
            "agent_name": r.agent_name,
        }

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self._rows):
            raise IndexError(f"row {index} out of range for a dataset of {len(self._rows)} prompts")

    def batch(self, indices: Sequence[int]) -> Batch:
        """Rows `indices` as a Batch: `prompts` [B, P] int64 left-padded with the pad id, `attention_mask`
        [B, P] int64 (1 on prompt tokens), P = longest prompt among them; object columns `data_source`,
        `ground_truth` (str), `extra_info` (dict), `raw_prompt` (messages), `index` (row number in this
        dataset), and `agent_name` when any row of the dataset has one (None for rows without). With a
        vision-language model also `images` (each row's encoded images, PNG/JPEG bytes as in the file) and
        `multi_modal_inputs` (each row's `pixel_values` and `image_grid_thw`, None for a row without
        images): objects per row, so splitting the batch keeps every row's images with it."""
        rows = [int(i) for i in indices]
        if not rows:
            raise ValueError("batch() needs at least one index")
        for i in rows:
            self._check_index(i)
        lengths = [int(self._offsets[i + 1] - self._offsets[i]) for i in rows]
        width = max(lengths)
        prompts = torch.full((len(rows), width), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(rows), width), dtype=torch.int64)
        for b, (i, n) in enumerate(zip(rows, lengths, strict=True)):
            tokens = self._ids[self._offsets[i] : self._offsets[i + 1]]
            prompts[b, width - n :] = torch.from_numpy(tokens.astype(np.int64))
            mask[b, width - n :] = 1
        picked = [self._rows[i] for i in rows]
        objects: dict[str, list[Any]] = {
            "data_source": [r.data_source for r in picked],
            "ground_truth": [r.ground_truth for r in picked],
            "extra_info": [r.extra_info for r in picked],
            "raw_prompt": [r.messages for r in picked],
            "index": rows,
        }
        if self.has_agent_name:
            objects["agent_name"] = [r.agent_name for r in picked]
        if self.images is not None:
            objects["images"] = [list(r.images) for r in picked]
            objects["multi_modal_inputs"] = [
                self.images.process(r.images) if r.images else None for r in picked
            ]
        return Batch({"prompts": prompts, "attention_mask": mask}, objects)


def _as_row(value: Any) -> dict[str, Any] | RowProblem:
    if isinstance(value, Mapping):
        return dict(value)
    return RowProblem("not_an_object", "", f"a row must be a mapping of columns, got {type(value).__name__}")


def _overlong(length: int, limit: int, column: str) -> RowProblem:
    return RowProblem(
        "overlong",
        column,
        f"the prompt is {length} tokens after the chat template, longer than data.max_prompt_length={limit}",
        f"raise data.max_prompt_length, or set data.overlong_prompt=filter (drop) or truncate (keep the last "
        f"{limit} tokens)",
    )


def _empty_fix(report: DatasetReport, cfg: DataConfig) -> str:
    if report.filtered_overlong:
        return (
            f"every usable prompt is longer than {cfg.max_prompt_length} tokens: raise data.max_prompt_length"
        )
    if report.first_bad:
        return "every row is malformed; the first: " + next(iter(report.first_bad.values()))
    return "the files hold no rows"


def _log_report(report: DatasetReport) -> None:
    log.info("prompts from %s: %s", ", ".join(report.files), report.summary())
    if report.bad_rows:
        first = next(iter(report.first_bad.values()))
        log.warning("skipped %d malformed rows %s; the first: %s", report.skipped, report.bad_rows, first)
