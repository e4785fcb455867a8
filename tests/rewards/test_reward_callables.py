"""Reward functions passed as callables: signatures, sums and weights, bad returns named, and lambdas and
closures pickled to the real scoring processes (the path a run takes)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from test_reward_compute import RESPONSE_LENGTH, expected_token_scores, make_batch

from quartet.config.reward import RewardConfig
from quartet.rewards import RewardComputer, RewardFunctionError
from quartet.rewards.callables import RewardFuncs
from quartet.rewards.pool import ScorePool
from quartet.rewards.scoring import FuncItem


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)


def exact(prompts: list[Any], completions: list[str], ground_truth: list[str], **kwargs: Any) -> list[float]:
    """TRL style: 1 when the completion ends with the ground truth."""
    return [float(c.strip().endswith(g)) for c, g in zip(completions, ground_truth, strict=True)]


def words(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> dict[str, float]:
    """quartet's (verl's) per-sample style, with an extra metric."""
    return {"score": 0.1 * len(solution_str.split()), "chars": float(len(solution_str))}


def item(completion: str, truth: str = "4", **columns: Any) -> FuncItem:
    row = {"ground_truth": truth, "data_source": "src", "index": 3, **columns}
    return FuncItem([{"role": "user", "content": "2+2?"}], completion, row, "src")


def test_styles_are_summed_with_weights_and_reported_per_function() -> None:
    funcs = RewardFuncs([exact, words, lambda prompts, completions, **kw: [len(prompts[0])]], [2.0, 1.0, 0.5])
    out = funcs(*item("it is 4"))
    assert out == pytest.approx(
        {"exact": 1.0, "words": 0.3, "words/chars": 7.0, "lambda": 1.0, "score": 2.0 + 0.3 + 0.5}
    )
    assert funcs.names == ["exact", "words", "lambda"]


def test_a_trl_function_without_kwargs_gets_only_the_columns_it_names() -> None:
    seen: dict[str, Any] = {}

    def narrow(prompts: list[Any], completions: list[str], index: list[int]) -> list[float]:
        seen.update(prompts=prompts, completions=completions, index=index)
        return [1.0]

    def wide(completions: list[str], **kwargs: Any) -> list[float]:
        seen["kwargs"] = sorted(kwargs)
        return [0.0]

    RewardFuncs([narrow, wide])(*item("x", completion_ids=[5, 6]))
    assert seen["index"] == [3] and seen["completions"] == ["x"]
    assert seen["prompts"] == [[{"role": "user", "content": "2+2?"}]]
    assert seen["kwargs"] == ["completion_ids", "data_source", "ground_truth", "index", "prompts"]


@pytest.mark.parametrize(
    ("returned", "problem"),
    [([1.0, 2.0], "returned 2 values"), (None, "returned a NoneType"), ([math.nan], "returned \\[nan\\]"),
     ([None], "returned \\[None\\]"), (0.5, "returned a float")],
)  # fmt: skip
def test_a_bad_return_names_the_function_and_the_sample(returned: Any, problem: str) -> None:
    def broken(prompts: list[Any], completions: list[str], **kwargs: Any) -> Any:
        return returned

    with pytest.raises(
        RewardFunctionError, match=rf"'broken' {problem} for dataset row 3 \(data source 'src'\)"
    ):
        RewardFuncs([broken])(*item("x"))


def test_a_bad_signature_or_weight_fails_at_construction() -> None:
    with pytest.raises(RewardFunctionError, match="'two'.*completions"):
        RewardFuncs([_two])
    with pytest.raises(ValueError, match="2 entries for 1"):
        RewardFuncs([exact], [1.0, 2.0])
    with pytest.raises(ValueError, match="reward_weights\\[0\\]"):
        RewardFuncs([exact], [math.inf])
    with pytest.raises(ValueError, match="empty"):
        RewardFuncs([])


def _two(a: Any, b: Any) -> float:
    return 0.0


_two.__name__ = "two"


def test_lambdas_and_closures_score_in_the_scoring_processes() -> None:
    bonus = 0.25  # captured by value: the workers never import this test module's state

    def closure(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
        return [bonus + len(completions[0])]

    funcs = RewardFuncs([closure, lambda prompts, completions, ground_truth, **kw: [float(ground_truth[0])]])
    items = [item("ab", "3"), item("abcd", "5"), item("", "-1")]
    with ScorePool(funcs, num_workers=2, timeout_s=30) as pool:
        result = pool.score(items)
    assert result.scores == pytest.approx([0.25 + 2 + 3, 0.25 + 4 + 5, 0.25 + 0 - 1])
    assert [e["closure"] for e in result.extras] == pytest.approx([2.25, 4.25, 0.25])


def test_a_function_that_cannot_be_pickled_is_refused_at_once() -> None:
    import threading

    lock = threading.Lock()

    def holds_a_lock(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
        with lock:
            return [0.0]

    with pytest.raises(RewardFunctionError, match="cannot be pickled"):
        ScorePool(RewardFuncs([holds_a_lock]), timeout_s=5)


def test_the_computer_scores_a_batch_with_callables(tokenizer: Any) -> None:
    def truth_bonus(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
        return [0.5 if kwargs["ground_truth"][0] in completions[0] else 0.0]

    def bad_on_b(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
        return [] if completions[0] == "b" else [1.0]

    responses, truths = ["is 4", "b", "is 7"], ["4", "9", "4"]
    batch = make_batch(tokenizer, responses, truths, ["any/source"] * 3, index=[20, 21, 22])
    funcs = RewardFuncs([truth_bonus, bad_on_b], [1.0, 3.0])
    with RewardComputer(RewardConfig(num_workers=1), tokenizer, RESPONSE_LENGTH, reward_funcs=funcs) as rc:
        scored, metrics = rc.score(batch)
        failures = rc.take_failures()
    # independent: row 0 = 0.5 + 3, row 1 fails (0, counted), row 2 = 0 + 3
    expected = [3.5, 0.0, 3.0]
    assert scored["scores"].tolist() == pytest.approx(expected)
    assert torch.allclose(
        scored["token_level_scores"], expected_token_scores(expected, batch["response_mask"])
    )
    assert metrics["reward/error_count"] == 1.0 and metrics["reward/extra/truth_bonus"] == pytest.approx(0.25)
    assert [(f.row, f.status) for f in failures] == [(21, "error")]
    assert "'bad_on_b' returned 0 values for dataset row 21" in failures[0].reason


def test_callables_and_reward_function_together_are_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="keep one"):
        RewardComputer(
            RewardConfig(function="m:f"), tokenizer, RESPONSE_LENGTH, reward_funcs=RewardFuncs([exact])
        )


def test_a_per_sample_function_sees_the_reward_model_score_in_extra_info() -> None:
    def gated(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> float:
        return float(extra_info["rm_score"]) * 2 + float(extra_info["bias"])

    out = RewardFuncs([gated])(*item("x", extra_info={"bias": 1.0}, rm_score=0.25))
    assert out["score"] == pytest.approx(1.5)
