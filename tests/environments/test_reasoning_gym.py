"""reasoning-gym's tasks as quartet rows (issue 52, part 2): deterministic rows, and rewards equal to
reasoning-gym's own scorer on recorded answers, through quartet's rule scorer (`reasoning_gym/<task>`)."""

from __future__ import annotations

import pytest

reasoning_gym = pytest.importorskip(
    "reasoning_gym", reason="the environments extra is not installed: make install"
)

from quartet.environments.reasoning_gym import GymTask, compute_score, rows  # noqa: E402
from quartet.rewards.rules import default_compute_score  # noqa: E402

TASKS = (
    GymTask("leg_counting", seed=3, size=50),
    GymTask("basic_arithmetic", {"min_terms": 2, "max_terms": 3}, seed=5, size=50, weight=2.0),
    GymTask("word_sorting", seed=7, size=50),
)


def _entry(row: dict) -> dict:
    """The entry a row names, built here straight from reasoning-gym (not through quartet)."""
    info = row["extra_info"]
    kwargs = {} if info["task"] != "basic_arithmetic" else {"min_terms": 2, "max_terms": 3}
    dataset = reasoning_gym.create_dataset(info["task"], seed=info["seed"], size=info["size"], **kwargs)
    return dataset[info["index"]]


def test_rows_are_deterministic_and_carry_the_tasks_own_problems() -> None:
    first, again = rows(TASKS, 30, seed=11), rows(TASKS, 30, seed=11)
    assert first == again
    assert rows(TASKS, 30, seed=12) != first  # the mixture's draws follow the seed
    assert {r["data_source"] for r in first} == {f"reasoning_gym/{t.name}" for t in TASKS}
    for row in first:
        entry = _entry(row)
        assert row["prompt"][-1] == {"role": "user", "content": entry["question"]}
        assert row["prompt"][0]["role"] == "system" and "<answer>" in row["prompt"][0]["content"]
        assert row["reward_model"]["ground_truth"] == str(entry["answer"])
    # each task's rows walk its dataset in order: indices 0, 1, 2, ... per task
    for task in TASKS:
        indices = [r["extra_info"]["index"] for r in first if r["extra_info"]["task"] == task.name]
        assert indices == list(range(len(indices)))
    assert rows(TASKS[:1], 2, system_prompt=None)[0]["prompt"][0]["role"] == "user"


@pytest.mark.parametrize(
    "template",
    [
        "Let me think. <answer>{answer}</answer>",  # right
        "<answer> {answer} </answer>",  # right, spaced (some tasks give partial credit)
        "<answer>{answer}</answer> no wait <answer>0</answer>",  # the last answer counts
        "The answer is {answer}.",  # no tags: reasoning-gym scores it 0
        "<answer>not it</answer>",  # wrong
    ],
)
def test_rewards_equal_reasoning_gyms_own_scorer_on_recorded_answers(template: str) -> None:
    from reasoning_gym.utils import extract_answer

    for row in rows(TASKS, 12, seed=1):
        entry = _entry(row)
        response = template.format(answer=entry["answer"])
        scorer = reasoning_gym.get_score_answer_fn(row["extra_info"]["task"])
        expected = float(scorer(extract_answer(response), entry))
        info = row["extra_info"]
        truth = row["reward_model"]["ground_truth"]
        assert compute_score(row["data_source"], response, truth, info) == expected
        # and through quartet's rule scorer, as a run scores the row
        assert default_compute_score(row["data_source"], response, truth, info) == expected


def test_the_scores_cover_right_wrong_and_partial() -> None:
    """The recorded answers above are not all 1 or all 0 (the equality check has something to bite on)."""
    row = rows(TASKS[:1], 1, seed=0)[0]
    answer = row["reward_model"]["ground_truth"]
    responses = (f"<answer>{answer}</answer>", f"<answer> {answer} </answer>", "<answer>x</answer>")
    scores = {compute_score(row["data_source"], r, answer, row["extra_info"]) for r in responses}
    assert 1.0 in scores and 0.0 in scores


def test_bad_tasks_and_rows_are_named() -> None:
    with pytest.raises(ValueError, match="no task 'leg_countin'"):
        GymTask("leg_countin")
    with pytest.raises(ValueError, match="weight"):
        GymTask("leg_counting", weight=0)
    with pytest.raises(ValueError, match=r"extra_info lacks \['config', 'seed', 'size', 'index'\]"):
        compute_score("reasoning_gym/leg_counting", "<answer>3</answer>", "3", {"task": "leg_counting"})
    with pytest.raises(ValueError, match="at least one GymTask"):
        rows([], 3)


def test_the_tool_writes_parquet_rows_equal_to_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import importlib.util
    from pathlib import Path

    import pyarrow.parquet as pq

    path = Path(__file__).resolve().parents[2] / "tools" / "reasoning_gym_data.py"
    spec = importlib.util.spec_from_file_location("reasoning_gym_data", path)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    args = [
        "--task",
        "leg_counting",
        "--task",
        "basic_arithmetic:2",
        "--train",
        "8",
        "--val",
        "4",
        "--seed",
        "3",
    ]
    train, val = tool.main([str(tmp_path), *args])
    written = pq.read_table(train).to_pylist()
    tasks = [GymTask("leg_counting", seed=3, size=8), GymTask("basic_arithmetic", seed=3, size=8, weight=2.0)]
    assert len(pq.read_table(val).to_pylist()) == 4
    assert written == rows(tasks, 8, seed=3)
    held_out = {r["prompt"][-1]["content"] for r in pq.read_table(val).to_pylist()}
    assert not held_out & {r["prompt"][-1]["content"] for r in written}
