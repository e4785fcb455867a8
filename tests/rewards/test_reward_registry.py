"""`@register_reward` and `reward.rule_mode` as the scoring workers see them (real worker processes)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from quartet.config import load_config
from quartet.core.registry import CUSTOM_MODULES_ENV, import_custom_module
from quartet.rewards.compute import RewardComputer
from quartet.rewards.registry import register_reward, registered_rewards
from quartet.rewards.rules.registry import RULE_FUNCTIONS, known_data_sources, select_scorer
from quartet.rewards.scoring import ScoreItem


@pytest.mark.parametrize(("mode", "expected"), [("verl", [0.0, 1.0]), ("lenient", [1.0, 1.0])])
def test_rule_mode_reaches_the_scoring_workers(mode: str, expected: list[float]) -> None:
    cfg = load_config(overrides=[f"reward.rule_mode={mode}"])
    computer = RewardComputer(cfg.reward, tokenizer=None, max_response_length=8)
    try:
        pool = computer._start_pool()
        try:
            assert pool.spec == RULE_FUNCTIONS[mode]
            items = [
                ScoreItem("openai/gsm8k", "so ####42", "42"),
                ScoreItem("openai/gsm8k", "so #### 42", "42"),
            ]
            assert pool.score(items).scores == expected  # `####42`: verl gives 0, the lenient rule 1
        finally:
            pool.close()
    finally:
        computer.close()


def test_registered_reward_is_selected_listed_and_reaches_workers(tmp_path: Path) -> None:
    source = f"my/source-{uuid.uuid4().hex[:8]}"

    @register_reward(source)
    def score(data_source: str, solution_str: str, ground_truth: object, extra_info: object = None) -> float:
        return 0.5

    assert select_scorer(source) is score and registered_rewards()[source] is score
    assert source in known_data_sources()
    with pytest.raises(ValueError, match="already registered"):
        register_reward(source)

    module = tmp_path / "rewards_module.py"
    other = f"my/other-{uuid.uuid4().hex[:8]}"
    module.write_text(
        "from quartet.rewards.registry import register_reward\n"
        f"register_reward({other!r})(lambda data_source, solution_str, ground_truth, extra_info=None: "
        "float(len(solution_str)))\n"
    )
    import_custom_module(str(module))
    assert str(module) in os.environ[CUSTOM_MODULES_ENV]
    cfg = load_config()
    computer = RewardComputer(cfg.reward, tokenizer=None, max_response_length=8)
    try:
        pool = computer._start_pool()
        try:  # a fresh worker process scores with the function the module registered
            assert pool.score([ScoreItem(other, "abcd", None)]).scores == [4.0]
        finally:
            pool.close()
    finally:
        computer.close()
