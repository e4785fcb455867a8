"""RewardComputer: decoding, scoring, shaping and placing, with a real tokenizer and real worker processes."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from quartet.config.reward import RewardConfig
from quartet.core.batch import Batch
from quartet.rewards import InlineScorer, RewardComputer, UnknownDataSourceError

FUNCTIONS = textwrap.dedent(
    """
    import time

    def graded(data_source, solution_str, ground_truth, extra_info):
        if solution_str == "":
            return {"score": 0.25, "empty": True}
        if "explode" in solution_str:
            raise RuntimeError("exploded")
        if "dawdle" in solution_str:
            time.sleep(600)
        score = float(solution_str.strip().endswith(str(ground_truth)))
        if isinstance(extra_info, dict) and "rm_score" in extra_info:
            score += extra_info["rm_score"]
        return {"score": score, "words": len(solution_str.split())}
    """
)
RESPONSE_LENGTH = 24


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("rewards") / "graded.py"
    path.write_text(FUNCTIONS)
    return f"{path}:graded"


def make_batch(
    tokenizer: Any,
    responses: list[str | tuple[str, str, str]],
    truths: list[Any],
    sources: list[str],
    length: int = RESPONSE_LENGTH,
    **columns: Any,
) -> Batch:
    """Right-padded responses ending in EOS; a (model, tool, model) triple has a tool segment (mask 0)."""
    ids = torch.full((len(responses), length), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(responses), length), dtype=torch.long)
    for i, response in enumerate(responses):
        parts = response if isinstance(response, tuple) else (response,)
        row: list[int] = []
        row_mask: list[int] = []
        for k, part in enumerate(parts):
            tokens = tokenizer(part, add_special_tokens=False)["input_ids"]
            row += tokens
            row_mask += [0 if k % 2 else 1] * len(tokens)
        if row:
            row, row_mask = row + [tokenizer.eos_token_id], row_mask + [1]
        row, row_mask = row[:length], row_mask[:length]
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = torch.tensor(row_mask, dtype=torch.long)
    tensors = {
        "responses": ids,
        "response_mask": mask,
        **{k: v for k, v in columns.items() if torch.is_tensor(v)},
    }
    objects = {"ground_truth": truths, "data_source": sources}
    objects |= {k: v for k, v in columns.items() if not torch.is_tensor(v)}
    return Batch(tensors, objects)


def expected_token_scores(outcome: list[float], mask: torch.Tensor) -> torch.Tensor:
    """The slow obvious placement: each row's outcome on its last mask-1 position."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for i in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[i, t] != 0]
        if valid:
            out[i, valid[-1]] = outcome[i]
    return out


def dapo_penalty(length: int, max_length: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment, written from the paper's cases."""
    if length <= max_length - buffer:
        return 0.0
    if length <= max_length:
        return ((max_length - buffer) - length) / buffer * factor
    return -factor


@pytest.fixture
def inline(spec: str) -> Iterator[InlineScorer]:
    yield InlineScorer(spec)


def test_decoded_texts_skip_special_tokens_and_keep_tool_segments(
    tokenizer: Any, inline: InlineScorer
) -> None:
    batch = make_batch(
        tokenizer,
        ["The answer is 7", ("Let me call", " [tool says 3]", " so 3"), ""],
        ["7", "3", "0"],
        ["x"] * 3,
    )
    computer = RewardComputer(
        RewardConfig(function="unused.py:fn"), tokenizer, RESPONSE_LENGTH, backend=inline
    )
    assert computer.response_texts(batch) == ["The answer is 7", "Let me call [tool says 3] so 3", ""]


def test_scores_are_placed_on_the_last_valid_token(tokenizer: Any, spec: str, inline: InlineScorer) -> None:
    responses: list[str | tuple[str, str, str]] = [
        "so it is 12",
        "so it is 13",
        ("I ask", " a tool: 5", " then 5"),
        "",
        "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25",  # truncated, no EOS
    ]
    truths = ["12", "12", "5", "1", "25"]
    batch = make_batch(tokenizer, responses, truths, ["x"] * len(responses))
    computer = RewardComputer(RewardConfig(function=spec), tokenizer, RESPONSE_LENGTH, backend=inline)
    scored, metrics = computer.score(batch)

    texts = computer.response_texts(batch)
    expected_scores = [
        0.25 if t == "" else float(t.strip().endswith(g)) for t, g in zip(texts, truths, strict=True)
    ]
    assert scored["scores"].dtype == torch.float32 and scored["scores"].tolist() == expected_scores
    token_scores = scored["token_level_scores"]
    assert token_scores.dtype == torch.float32 and token_scores.shape == (len(responses), RESPONSE_LENGTH)
    assert torch.equal(token_scores, expected_token_scores(expected_scores, batch["response_mask"]))
    assert token_scores[3].abs().sum() == 0  # an empty response is scored but has no token to hold it
    # Extra metrics: the mean over the rows that returned the key.
    words = [len(t.split()) for t in texts if t]
    assert metrics["reward/extra/words"] == pytest.approx(sum(words) / len(words))
    assert metrics["reward/extra/empty"] == 1.0
    assert metrics["reward/error_count"] == 0 and metrics["reward/timeout_count"] == 0
    assert metrics["reward/score_time_s"] >= 0
    assert set(scored.keys()) == {"token_level_scores", "scores"}
    assert set(batch.union(scored).keys()) >= {"responses", "token_level_scores", "scores"}


def test_overlong_penalty_is_added_to_the_placed_reward(
    tokenizer: Any, spec: str, inline: InlineScorer
) -> None:
    numbers = [" ".join(str(k) for k in range(n)) for n in (2, 6, 9, 12, 30)]
    batch = make_batch(tokenizer, numbers, ["0"] * len(numbers), ["x"] * len(numbers))
    cfg = RewardConfig(function=spec, overlong_buffer=8, overlong_penalty_factor=0.5)
    computer = RewardComputer(cfg, tokenizer, RESPONSE_LENGTH, backend=inline)
    scored, metrics = computer.score(batch)

    lengths = [
        max((t + 1 for t in range(RESPONSE_LENGTH) if m[t]), default=0) for m in batch["response_mask"]
    ]
    scores = scored["scores"].tolist()
    penalties = [dapo_penalty(n, RESPONSE_LENGTH, 8, 0.5) for n in lengths]
    assert any(p < 0 for p in penalties) and any(p == 0 for p in penalties)
    assert any(-0.5 < p < 0 for p in penalties)  # a length inside the ramp
    outcome = [s + p for s, p in zip(scores, penalties, strict=True)]
    assert torch.allclose(
        scored["token_level_scores"], expected_token_scores(outcome, batch["response_mask"])
    )
    assert metrics["reward/overlong_penalty/mean"] == pytest.approx(sum(penalties) / len(penalties))


def test_buffer_longer_than_the_response_is_refused(tokenizer: Any, inline: InlineScorer) -> None:
    with pytest.raises(ValueError, match="overlong_buffer"):
        RewardComputer(RewardConfig(overlong_buffer=30), tokenizer, RESPONSE_LENGTH, backend=inline)


def test_reward_model_scores_replace_the_rules(tokenizer: Any) -> None:
    batch = make_batch(
        tokenizer, ["a", "b"], ["1", "2"], ["no/rule/for/this"] * 2, rm_scores=torch.tensor([0.3, -1.5])
    )
    cfg = RewardConfig(model_path="/some/reward/model")
    with RewardComputer(cfg, tokenizer, RESPONSE_LENGTH) as computer:  # no pool is started for this
        scored, metrics = computer.score(batch)
    assert scored["scores"].tolist() == pytest.approx([0.3, -1.5])
    assert torch.allclose(
        scored["token_level_scores"], expected_token_scores([0.3, -1.5], batch["response_mask"])
    )
    assert "reward/error_count" not in metrics


def test_a_custom_function_sees_the_reward_model_score(
    tokenizer: Any, spec: str, inline: InlineScorer
) -> None:
    batch = make_batch(
        tokenizer,
        ["is 4", "is 5"],
        ["4", "4"],
        ["x", "x"],
        rm_scores=torch.tensor([0.5, 0.25]),
        extra_info=[None, {"split": "train"}],
    )
    computer = RewardComputer(RewardConfig(function=spec), tokenizer, RESPONSE_LENGTH, backend=inline)
    scored, _ = computer.score(batch)
    assert scored["scores"].tolist() == [1.5, 0.25]


def test_rules_by_data_source(tokenizer: Any) -> None:
    batch = make_batch(
        tokenizer,
        ["so #### 1,000", r"thus \boxed{\frac{1}{2}}", "3+4=7", "#### 5"],
        ["1000", "0.5", np.str_("7"), "6"],
        ["openai/gsm8k", "lighteval/MATH", "arithmetic", "gsm8k"],
    )
    computer = RewardComputer(RewardConfig(), tokenizer, RESPONSE_LENGTH, backend=InlineScorer())
    scored, _ = computer.score(batch)
    assert scored["scores"].tolist() == [1.0, 1.0, 1.0, 0.0]


def test_unknown_data_source_and_missing_column_fail_on_the_caller(tokenizer: Any) -> None:
    computer = RewardComputer(RewardConfig(), tokenizer, RESPONSE_LENGTH, backend=InlineScorer())
    with pytest.raises(UnknownDataSourceError, match="'my/data'"):
        computer.score(make_batch(tokenizer, ["a"], ["1"], ["my/data"]))
    batch = make_batch(tokenizer, ["a"], ["1"], ["gsm8k"]).drop("ground_truth")
    with pytest.raises(KeyError, match="no 'ground_truth' column"):
        computer.score(batch)


def test_raising_and_sleeping_rows_score_zero_and_are_counted(tokenizer: Any, spec: str) -> None:
    timeout = 0.5
    responses: list[str | tuple[str, str, str]] = ["is 1", "explode now", "dawdle a while", "is 2", "explode"]
    batch = make_batch(tokenizer, responses, ["1", "1", "1", "2", "1"], ["x"] * 5)
    cfg = RewardConfig(function=spec, num_workers=2, timeout_s=timeout)
    with RewardComputer(cfg, tokenizer, RESPONSE_LENGTH) as computer:
        start = time.monotonic()
        scored, metrics = computer.score(batch)
        assert time.monotonic() - start < 120  # the sleeper sleeps 600 s: a hang guard, not a speed check
        assert scored["scores"].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
        assert metrics["reward/error_count"] == 2 and metrics["reward/timeout_count"] == 1
        assert metrics["reward/worker_restarts"] == 1
        assert metrics["reward/extra/words"] == 2.0  # the two rows that returned it
        again, metrics = computer.score(batch.index([0, 3]))  # the stuck worker was replaced
        assert again["scores"].tolist() == [1.0, 1.0] and metrics["reward/timeout_count"] == 0
