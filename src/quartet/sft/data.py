"""Chat conversations for SFT: read rows (parquet or JSONL), check them, tokenize them with the chat
template, and mark the tokens the assistant wrote.

Layout (the multi-turn RL layout, so SFT and RL batches are the same thing):
    prompt        = the tokens before the first assistant turn's content (system, user, assistant header)
    response      = everything after it, to the end of the last assistant turn
    response_mask = 1 on assistant-written tokens (content and the turn's end token, e.g. `<|im_end|>`),
                    0 on later user/tool turns and on the template's headers between them

How the mask is found. For each assistant message k the template renders `messages[:k]` with the generation
prompt (it ends with the assistant header) and `messages[:k+1]` (it ends after the assistant's turn). Both
must be token prefixes of the whole rendered conversation: the prefix property. A template that rewrites
earlier turns (some drop past reasoning) breaks it, and the row is reported rather than trained on with a
wrong mask. The tokens between the two prefixes are the assistant's turn; the mask stops at the turn's last
special token (its end-of-turn token), because generation stops there: a newline the template writes after
`<|im_end|>` is never generated, so it is not trained.

Nothing is dropped silently: malformed rows raise `SFTDataError` naming file, row and field (or, with
`skip_bad_rows`, are counted with their reasons), and overlong rows are counted as filtered or truncated.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from quartet.core.batch import Batch

__all__ = [
    "LoadReport",
    "SFTDataError",
    "SFTExample",
    "check_messages",
    "check_tools",
    "collate",
    "load_sft_files",
    "read_rows",
    "tokenize_chat",
]

log = logging.getLogger(__name__)
_FORMATS = (".parquet", ".jsonl")
_KEEP_PROBLEMS = 10  # malformed-row messages kept in a report


class SFTDataError(ValueError):
    """A malformed row: which file, which row (0-based data row; JSONL also gives the line), which field."""

    def __init__(self, file: str, row: int, field: str, problem: str, line: int | None = None) -> None:
        self.file = file
        self.row = row
        self.field = field
        self.problem = problem
        self.line = line
        where = f"row {row}" + (f" (line {line})" if line is not None else "")
        super().__init__(f"{file}, {where}, field '{field}': {problem}")


class _RowProblem(ValueError):
    """What is wrong with one row, before the file and row are known."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class SFTExample:
    """One tokenized conversation (token ids as tuples; lengths: response_mask == response_ids)."""

    prompt_ids: tuple[int, ...]
    """Tokens before the first assistant turn's content."""

    response_ids: tuple[int, ...]
    """Tokens after the prompt, to the end of the last assistant turn."""

    response_mask: tuple[int, ...]
    """1 on assistant-written response tokens, 0 elsewhere."""

    messages: tuple[dict[str, Any], ...] = ()
    """The conversation (for evaluation)."""

    ground_truth: str | None = None
    """The row's `ground_truth` column when it has one (built-in tasks), else None."""

    @property
    def length(self) -> int:
        """Tokens of prompt and response."""
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def trained_tokens(self) -> int:
        """Tokens under the loss."""
        return sum(self.response_mask)


@dataclass
class LoadReport:
    """What loading a set of files did with each row."""

    files: tuple[str, ...] = ()
    rows: int = 0
    """Rows read."""
    kept: int = 0
    """Rows kept (truncated ones included)."""
    malformed: int = 0
    """Rows skipped as malformed (only with skipping on; otherwise the first one raises)."""
    overlong_filtered: int = 0
    """Rows longer than `max_length` that were dropped."""
    truncated: int = 0
    """Rows longer than `max_length` cut to it."""
    unverified_filtered: int = 0
    """Rows whose final assistant answer the task's verifier rejects, dropped (only with `keep_verified`)."""
    problems: list[str] = field(default_factory=list)
    """The first malformed rows' messages."""

    def as_dict(self) -> dict[str, Any]:
        """The counts (and first problems) as plain data."""
        return {
            "files": list(self.files),
            "rows": self.rows,
            "kept": self.kept,
            "malformed": self.malformed,
            "overlong_filtered": self.overlong_filtered,
            "truncated": self.truncated,
            "unverified_filtered": self.unverified_filtered,
            "problems": list(self.problems),
        }

    def summary(self) -> str:
        """One line of counts."""
        line = (
            f"{self.rows} rows read, {self.kept} kept, {self.malformed} malformed (skipped), "
            f"{self.overlong_filtered} overlong filtered, {self.truncated} truncated"
        )
        if self.unverified_filtered:
            line += f", {self.unverified_filtered} failed the verifier (dropped)"
        return line


# ---- reading ----------------------------------------------------------------------------------------------


def read_rows(path: str | Path) -> Iterator[tuple[int, int | None, Any]]:
    """(row index, JSONL line or None, row) of a parquet or JSONL (one JSON object per line) file.

    A JSONL line that is not valid JSON is yielded as a `_RowProblem` (so the caller decides whether it
    stops the run or is counted); blank lines are not rows.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SFT data file {path} does not exist (resolved to {path.resolve()})")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield i, None, row
        return
    if suffix not in _FORMATS:
        raise ValueError(f"SFT data file {path}: unknown format '{suffix}'; use one of {list(_FORMATS)}")
    row = 0
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                value: Any = json.loads(line)
            except json.JSONDecodeError as err:
                value = _RowProblem("", f"not valid JSON ({err.msg} at column {err.colno})")
            yield row, line_no, value
            row += 1


def check_messages(row: Any, key: str) -> list[dict[str, Any]]:
    """The row's conversation, checked: a non-empty list of {role: str, content: str} with an assistant
    turn (content may be null on a message with `tool_calls`). Raises `_RowProblem` naming the field."""
    if isinstance(row, _RowProblem):
        raise row
    if not isinstance(row, dict):
        raise _RowProblem("", f"a row must be an object of columns, got {type(row).__name__}")
    if key not in row:
        raise _RowProblem(key, f"missing; the row has columns {sorted(row)}")
    messages = row[key]
    if not isinstance(messages, list):
        raise _RowProblem(key, f"expected a list of messages, got {type(messages).__name__}")
    if not messages:
        raise _RowProblem(key, "empty conversation")
    for i, message in enumerate(messages):
        name = f"{key}[{i}]"
        if not isinstance(message, dict):
            raise _RowProblem(name, f"expected a {{role, content}} object, got {type(message).__name__}")
        if not isinstance(message.get("role"), str) or not message["role"]:
            raise _RowProblem(f"{name}.role", f"expected a non-empty string, got {message.get('role')!r}")
        content = message.get("content")
        if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
            raise _RowProblem(f"{name}.content", f"expected a string, got {type(content).__name__}")
    if not any(m["role"] == "assistant" for m in messages):
        raise _RowProblem(key, "no assistant turn (nothing to train on)")
    # Parquet gives every struct field to every message (None where absent): drop the absent ones, so a
    # template testing `message.get('tool_calls')` sees what the writer wrote.
    return [{k: v for k, v in m.items() if v is not None or k == "content"} for m in messages]


def check_tools(row: Any, key: str) -> list[dict[str, Any]] | None:
    """The row's tool schemas: a list of objects, JSON text of one, or None/absent (no tools)."""
    value = row.get(key) if isinstance(row, dict) else None
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise _RowProblem(key, f"is not valid JSON: {err}") from None
    if hasattr(value, "tolist"):  # a numpy array read from parquet
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise _RowProblem(key, f"must be a list of tool schemas (objects), got {type(value).__name__}")
    return [dict(t) for t in value] or None


# ---- tokenizing -------------------------------------------------------------------------------------------


def _render(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    generation_prompt: bool,
    key: str,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    try:
        ids = tokenizer.apply_chat_template(
            list(messages),
            tools=tools,
            tokenize=True,
            add_generation_prompt=generation_prompt,
            return_dict=False,
        )
    except Exception as err:  # jinja errors of the model's own template: report them with the row
        raise _RowProblem(key, f"the chat template failed: {type(err).__name__}: {err}") from err
    return [int(t) for t in ids]


def tokenize_chat(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    key: str = "messages",
    tools: list[dict[str, Any]] | None = None,
) -> SFTExample:
    """Prompt, response and assistant mask of a checked conversation (see the module docstring).

    tools: OpenAI tool schemas rendered into every prefix (the template's tools block), as the agent loops
    render them in RL.
    """
    full = _render(tokenizer, messages, False, key, tools)
    special = set(tokenizer.all_special_ids)
    mask = [0] * len(full)
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    starts, end = [], 0
    for k in turns:
        before = _render(tokenizer, messages[:k], True, key, tools)
        through = _render(tokenizer, messages[: k + 1], False, key, tools)
        if full[: len(before)] != before or full[: len(through)] != through or len(through) <= len(before):
            raise _RowProblem(
                f"{key}[{k}]",
                "prefix property broken: rendering the conversation up to this assistant turn does not give "
                "a prefix of the whole conversation's tokens (the chat template rewrites earlier turns)",
            )
        span = through[len(before) :]
        last_special = max((i for i, t in enumerate(span) if t in special), default=len(span) - 1)
        mask[len(before) : len(before) + last_special + 1] = [1] * (last_special + 1)
        starts.append(len(before))
        end = len(through)
    p = starts[0]
    if p == 0:  # the log-prob of the first response token is read at the position before it
        raise _RowProblem(key, "the chat template renders no token before the first assistant turn")
    return SFTExample(tuple(full[:p]), tuple(full[p:end]), tuple(mask[p:end]), tuple(messages))


def _fit_length(ex: SFTExample, max_length: int, truncate: bool) -> SFTExample | None:
    """`ex` if it fits; cut to `max_length` tokens with `truncate` (None if no trained token is left)."""
    if ex.length <= max_length:
        return ex
    keep = max_length - len(ex.prompt_ids)
    if not truncate or keep <= 0 or not any(ex.response_mask[:keep]):
        return None
    return dataclasses.replace(ex, response_ids=ex.response_ids[:keep], response_mask=ex.response_mask[:keep])


def load_sft_files(
    paths: Sequence[str | Path],
    tokenizer: Any,
    *,
    messages_key: str = "messages",
    tools_key: str = "tools",
    max_length: int = 1024,
    truncate: bool = False,
    skip_bad_rows: bool = False,
    keep_verified: bool = False,
) -> tuple[list[SFTExample], LoadReport]:
    """Every usable conversation of `paths`, tokenized, and the counts of what happened to each row.

    Raises `SFTDataError` at the first malformed row unless `skip_bad_rows`. `keep_verified`: keep only the
    rows whose final assistant message the built-in verifier of their `data_source` accepts against their
    `ground_truth` (rejection-sampled demonstrations; the dropped rows are counted); a row without those
    columns, or of a source with no built-in verifier, is then an error naming it.
    """
    report = LoadReport(files=tuple(str(p) for p in paths))
    examples: list[SFTExample] = []
    for path in paths:
        for row_index, line, row in read_rows(path):
            report.rows += 1
            try:
                messages = check_messages(row, messages_key)
                tools = check_tools(row, tools_key)
                ex = tokenize_chat(tokenizer, messages, messages_key, tools)
            except _RowProblem as problem:
                err = SFTDataError(str(path), row_index, problem.field, problem.problem, line)
                if not skip_bad_rows:
                    raise err from None
                report.malformed += 1
                if len(report.problems) < _KEEP_PROBLEMS:
                    report.problems.append(str(err))
                continue
            truth = row.get("ground_truth")
            if truth is not None:
                ex = dataclasses.replace(ex, ground_truth=str(truth))
            if keep_verified and not _verified(row, messages, str(path), row_index, line):
                report.unverified_filtered += 1
                continue
            fitted = _fit_length(ex, max_length, truncate)
            if fitted is None:
                report.overlong_filtered += 1
                continue
            report.truncated += fitted is not ex
            report.kept += 1
            examples.append(fitted)
    log.info("SFT data %s: %s", ", ".join(report.files), report.summary())
    for message in report.problems:
        log.warning("skipped malformed row: %s", message)
    return examples, report


def _verified(row: Any, messages: list[dict[str, Any]], path: str, row_index: int, line: int | None) -> bool:
    """Whether the row's final assistant message passes its task's verifier (`keep_verified`)."""
    from quartet.tasks import task_scorer

    source, truth = row.get("data_source"), row.get("ground_truth")
    if source is None or truth is None:
        missing = "data_source" if source is None else "ground_truth"
        problem = f"sft.keep_verified needs a '{missing}' column to check the answer; add it or turn it off"
        raise SFTDataError(path, row_index, missing, problem, line)
    scorer = task_scorer(str(source))
    if scorer is None:
        problem = f"no built-in verifier for data_source '{source}'; sft.keep_verified covers built-in tasks"
        raise SFTDataError(path, row_index, "data_source", problem, line)
    final = next(m for m in reversed(messages) if m.get("role") == "assistant")
    text = str(final.get("content") or "")
    return scorer(text, str(truth), {"final_message": text}) >= 1.0


# ---- batching ---------------------------------------------------------------------------------------------


def collate(examples: Sequence[SFTExample], pad_id: int, multiple_of: int = 1) -> Batch:
    """The engine's Batch of `examples`: prompts left-padded, responses right-padded.

    With `multiple_of` > 1, rows are appended until the length is a multiple of it (so a split over
    data-parallel ranks adds none of its own): copies of the first row with `response_mask` all 0, which
    count no token and add nothing to the loss or its gradient.
    """
    if not examples:
        raise ValueError("collate() needs at least one example")
    rows = list(examples)
    fillers = -len(rows) % max(1, multiple_of)
    rows += [rows[0]] * fillers
    p = max(len(ex.prompt_ids) for ex in rows)
    r = max(len(ex.response_ids) for ex in rows)
    prompts = torch.full((len(rows), p), pad_id, dtype=torch.int64)
    responses = torch.full((len(rows), r), pad_id, dtype=torch.int64)
    attention = torch.zeros((len(rows), p + r), dtype=torch.int64)
    response_mask = torch.zeros((len(rows), r), dtype=torch.int64)
    for i, ex in enumerate(rows):
        pl, rl = len(ex.prompt_ids), len(ex.response_ids)
        prompts[i, p - pl :] = torch.tensor(ex.prompt_ids, dtype=torch.int64)
        responses[i, :rl] = torch.tensor(ex.response_ids, dtype=torch.int64)
        attention[i, p - pl : p + rl] = 1
        if i < len(examples):
            response_mask[i, :rl] = torch.tensor(ex.response_mask, dtype=torch.int64)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "attention_mask": attention,
        "response_mask": response_mask,
    }
    return Batch(tensors)
