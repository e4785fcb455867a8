"""Custom score functions named `path/to/file.py:fn` or `pkg.module:fn`: loading and its error messages."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from quartet.rewards import (
    InlineScorer,
    ItemStatus,
    RewardFunctionError,
    ScoreItem,
    load_function,
    resolve_spec,
)
from quartet.rewards.scoring import read_score

SOURCE = textwrap.dedent(
    """
    import functools

    def exact(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str.strip() == str(ground_truth))

    def with_extras(data_source, solution_str, ground_truth, extra_info):
        return {"score": 1.0, "length": len(solution_str), "pred": solution_str}

    def helper_a(x):
        return x

    def _private():
        pass

    NOT_A_FUNCTION = 3

    def too_few(solution_str, ground_truth):
        return 0.0

    def picky(data_source, solution_str, ground_truth, extra_info):
        if solution_str == "bad":
            raise ValueError("cannot score this")
        return 1.0
    """
)


@pytest.fixture
def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(SOURCE)
    return path


def test_load_by_file_path(reward_file: Path) -> None:
    fn = load_function(f"{reward_file}:exact")
    assert fn("x", " 4 ", "4", None) == 1.0
    assert fn("x", "5", "4", None) == 0.0


def test_relative_path_is_resolved_against_the_current_directory(
    reward_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(reward_file.parent)
    assert resolve_spec("my_reward.py:exact") == f"{reward_file}:exact"
    assert resolve_spec("./my_reward.py:exact") == f"{reward_file}:exact"
    assert (
        resolve_spec("quartet.rewards.rules.gsm8k:compute_score")
        == "quartet.rewards.rules.gsm8k:compute_score"
    )
    assert load_function("my_reward.py:exact")("x", "4", "4", None) == 1.0


def test_load_by_module_path() -> None:
    fn = load_function("quartet.rewards.rules.gsm8k:compute_score")
    assert fn("gsm8k", "#### 3", "3", None) == 1.0


def test_missing_function_lists_the_functions_of_the_file(reward_file: Path) -> None:
    with pytest.raises(RewardFunctionError) as info:
        load_function(f"{reward_file}:exakt")
    message = str(info.value)
    assert str(reward_file) in message and "'exakt'" in message
    for name in ("exact", "with_extras", "helper_a", "picky"):
        assert name in message
    assert "_private" not in message and "partial" not in message


def test_missing_file_module_and_bad_spec_are_named(tmp_path: Path) -> None:
    with pytest.raises(RewardFunctionError, match="no file .*nowhere.py"):
        load_function(f"{tmp_path}/nowhere.py:fn")
    with pytest.raises(RewardFunctionError, match="no module 'quartet.no_such_module'"):
        load_function("quartet.no_such_module:fn")
    with pytest.raises(RewardFunctionError, match="is not of the form"):
        load_function("file.py")
    with pytest.raises(RewardFunctionError, match="has no function 'nope'"):
        load_function("quartet.rewards.rules.gsm8k:nope")


def test_import_error_in_the_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("import this_module_does_not_exist\n")
    with pytest.raises(RewardFunctionError, match=r"importing .*broken.py.* failed: ModuleNotFoundError"):
        load_function(f"{path}:fn")


def test_signature_and_callable_are_checked(reward_file: Path) -> None:
    with pytest.raises(RewardFunctionError, match="must accept"):
        load_function(f"{reward_file}:too_few")
    with pytest.raises(RewardFunctionError, match="not a function"):
        load_function(f"{reward_file}:NOT_A_FUNCTION")


def test_two_files_with_the_same_name_do_not_collide(tmp_path: Path) -> None:
    for sub, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "reward.py").write_text(f"def fn(d, s, g, e):\n    return {value}\n")
    assert load_function(f"{tmp_path}/a/reward.py:fn")("", "", "", None) == 1.0
    assert load_function(f"{tmp_path}/b/reward.py:fn")("", "", "", None) == 2.0


def test_read_score_accepts_numbers_and_dicts() -> None:
    assert read_score(True).score == 1.0
    value = read_score({"score": 0.5, "acc": True, "pred": "x"})
    assert (value.score, value.extras, value.ignored) == (0.5, {"acc": 1.0}, ("pred",))
    for bad in ({"acc": 1.0}, "1.0", None, float("nan")):
        with pytest.raises((TypeError, ValueError)):
            read_score(bad)


def test_inline_scorer_counts_errors_and_keeps_extras(reward_file: Path) -> None:
    scorer = InlineScorer(f"{reward_file}:picky")
    result = scorer.score([ScoreItem("x", "good", "", None), ScoreItem("x", "bad", "", None)])
    assert result.scores == [1.0, 0.0]
    assert result.statuses == [ItemStatus.OK, ItemStatus.ERROR]
    assert (result.error_count, result.timeout_count) == (1, 0)
    extras = InlineScorer(f"{reward_file}:with_extras").score([ScoreItem("x", "abc", "", None)]).extras
    assert extras == [{"length": 3.0}]
