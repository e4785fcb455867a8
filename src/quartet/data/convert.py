"""Convert GSM8K- and MATH-style JSON Lines into verl's RL parquet layout (what `PromptDataset` reads).

    python -m quartet.data.convert gsm8k train.jsonl gsm8k_train.parquet
    python -m quartet.data.convert math test.jsonl math_test.parquet --split test --skip-bad-lines

GSM8K (`question`, `answer` ending in `#### 42`): the prompt is the question followed by verl's instruction
to end with `#### <answer>`; the ground truth is the number after the last `####`, commas removed
(`1,234` -> `1234`); `data_source` is "openai/gsm8k", the name verl's scorer table uses for GSM8K.

MATH (`problem`, `solution` with `\\boxed{...}`): the prompt is the problem followed by verl's instruction to
put the final answer in `\\boxed{}`; the ground truth is the content of the LAST `\\boxed{...}` (or
`\\fbox{...}`) of the solution, read with balanced braces so `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`.
`data_source` is "lighteval/MATH": one of the names verl routes to its MATH answer checker (verl's own
preprocessing now writes "DigitalLearningGmbH/MATH-lighteval", which it treats the same way), so the files
also work with verl; `--data-source` sets another name.

A line that is not JSON, lacks a field, or has no final answer stops the conversion with an error naming
the line, or with `--skip-bad-lines` is counted and skipped (the first few are logged).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from quartet.data.errors import DataError, RowProblem
from quartet.data.reading import read_rows
from quartet.tasks.rows import rl_row, write_parquet

__all__ = [
    "GSM8K_DATA_SOURCE",
    "GSM8K_INSTRUCTION",
    "MATH_DATA_SOURCE",
    "MATH_INSTRUCTION",
    "ConvertReport",
    "SourceKind",
    "convert_jsonl",
    "gsm8k_final_answer",
    "last_boxed",
    "main",
]

log = logging.getLogger(__name__)

GSM8K_DATA_SOURCE = "openai/gsm8k"
MATH_DATA_SOURCE = "lighteval/MATH"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
_KEEP_PROBLEMS = 5


class SourceKind(StrEnum):
    """The input layouts `convert_jsonl` knows."""

    GSM8K = "gsm8k"
    MATH = "math"


@dataclass
class ConvertReport:
    """What a conversion did with each input line."""

    source: str
    output: str
    rows: int = 0
    """Input rows (non-blank lines)."""
    written: int = 0
    skipped: int = 0
    """Bad lines skipped (only with skipping on; otherwise the first one raises)."""
    problems: list[str] = field(default_factory=list)
    """The first skipped lines' messages."""

    def summary(self) -> str:
        """One line of counts."""
        counts = f"{self.rows} rows, {self.written} written, {self.skipped} skipped"
        return f"{self.source} -> {self.output}: {counts}"


# ---- answers ---------------------------------------------------------------------------------------------


def gsm8k_final_answer(answer: str) -> str:
    """The number after the last `####` of a GSM8K answer, without thousands commas; ValueError if none."""
    if "####" not in answer:
        raise ValueError("no '####' final answer")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "").removeprefix("$").rstrip(".").strip()
    if not _NUMBER.match(final):
        raise ValueError(f"the text after '####' is not a number: {final!r}")
    return final


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` / `\\fbox{...}` (balanced braces), or of `\\boxed 5` (up to
    `$` or the end); None when there is none or its braces never close."""
    start, command = max((text.rfind(c), c) for c in ("\\boxed", "\\fbox"))
    if start < 0:
        return None
    rest = text[start + len(command) :]
    if rest.startswith(" "):  # `\boxed 5$`: the argument is one token, ended by `$`
        value = rest.split("$", 1)[0].strip()
        return value or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


# ---- rows ------------------------------------------------------------------------------------------------


def _text_field(record: dict[str, Any], name: str) -> str:
    value = record.get(name)
    if name not in record:
        raise RowProblem("missing_field", name, f"no '{name}' field; the line has {sorted(record)}")
    if not isinstance(value, str) or not value.strip():
        raise RowProblem("bad_field", name, f"expected a non-empty string, got {value!r}")
    return value


def _gsm8k_row(record: dict[str, Any], index: int, split: str, data_source: str) -> dict[str, Any]:
    question, answer = _text_field(record, "question"), _text_field(record, "answer")
    try:
        truth = gsm8k_final_answer(answer)
    except ValueError as err:
        raise RowProblem(
            "no_final_answer", "answer", str(err), "end the answer with '#### <number>'"
        ) from err
    return rl_row(
        [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
        data_source,
        truth,
        index=index,
        split=split,
        ability="math",
        extra={"question": question, "answer": answer},
    )


def _math_row(record: dict[str, Any], index: int, split: str, data_source: str) -> dict[str, Any]:
    problem, solution = _text_field(record, "problem"), _text_field(record, "solution")
    truth = last_boxed(solution)
    if truth is None or not truth.strip():
        raise RowProblem(
            "no_final_answer", "solution", "no \\boxed{...} answer with balanced braces in the solution"
        )
    return rl_row(
        [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}],
        data_source,
        truth,
        index=index,
        split=split,
        ability="math",
        extra={"question": problem, "answer": solution},
    )


_CONVERTERS: dict[SourceKind, tuple[Callable[[dict[str, Any], int, str, str], dict[str, Any]], str]] = {
    SourceKind.GSM8K: (_gsm8k_row, GSM8K_DATA_SOURCE),
    SourceKind.MATH: (_math_row, MATH_DATA_SOURCE),
}


def convert_jsonl(
    kind: SourceKind,
    source: str | Path,
    output: str | Path,
    *,
    split: str = "train",
    skip_bad_lines: bool = False,
    data_source: str | None = None,
) -> ConvertReport:
    """Convert `source` (JSON Lines of `kind`) into `output` (`.parquet`, or `.jsonl`); the counts.

    Raises `DataError` naming the line of the first bad row unless `skip_bad_lines`.
    """
    convert, default_source = _CONVERTERS[SourceKind(kind)]
    output = Path(output)
    if output.suffix.lower() not in (".parquet", ".jsonl"):
        raise DataError(str(output), f"unknown output format '{output.suffix}'", fix="name a .parquet file")
    report = ConvertReport(str(source), str(output))
    rows: list[dict[str, Any]] = []
    for sourced in read_rows(source):
        report.rows += 1
        try:
            if isinstance(sourced.value, RowProblem):
                raise sourced.value
            rows.append(convert(sourced.value, len(rows), split, data_source or default_source))
        except RowProblem as problem:
            error = sourced.source.error(problem)
            if not skip_bad_lines:
                raise sourced.source.error(problem, hint="or pass --skip-bad-lines") from None
            report.skipped += 1
            if len(report.problems) < _KEEP_PROBLEMS:
                report.problems.append(str(error))
    if not rows:
        raise DataError(str(source), f"no convertible rows ({report.summary()})")
    if output.suffix.lower() == ".parquet":
        write_parquet(rows, output)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    report.written = len(rows)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); exit status 0 on success, 2 on a data error."""
    parser = argparse.ArgumentParser(
        prog="python -m quartet.data.convert", description="JSON Lines -> verl RL parquet"
    )
    parser.add_argument("kind", choices=[k.value for k in SourceKind], help="input layout")
    parser.add_argument("source", help="input JSON Lines file")
    parser.add_argument("output", help="output .parquet (or .jsonl) file")
    parser.add_argument("--split", default="train", help="written to extra_info.split (default: train)")
    parser.add_argument("--skip-bad-lines", action="store_true", help="count and skip bad lines")
    parser.add_argument("--data-source", default=None, help="override the rows' data_source")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        report = convert_jsonl(
            SourceKind(args.kind),
            args.source,
            args.output,
            split=args.split,
            skip_bad_lines=args.skip_bad_lines,
            data_source=args.data_source,
        )
    except DataError as err:
        log.error("error: %s", err)
        return 2
    log.info("%s", report.summary())
    for problem in report.problems:
        log.warning("skipped: %s", problem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
