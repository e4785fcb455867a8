"""Every shipped config (examples/ and the demo's embedded one) loads and passes validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quartet.config import load_config
from quartet.core.choices import AdvantageEstimator
from quartet.demo import DEMOS, demo_config
from quartet.tasks.counting import CountingProblem, CountingSpec

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*/config.yaml"))


def test_examples_exist() -> None:
    assert {p.parent.name for p in EXAMPLES} >= {
        "grpo_arithmetic",
        "ppo_arithmetic",
        "grpo_gsm8k",
        "single_cpu",
        "single_gpu",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_example_config_validates(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the GSM8K example runs on the user's model, named on the command line as its README says
    needs_model = "gsm8k" in path.parent.name or path.parent.name == "single_gpu"
    overrides = ["model.path=/models/any-hf-folder"] if needs_model else []
    monkeypatch.chdir(path.parents[2])  # examples name their files relative to the repository root
    cfg = load_config(str(path), overrides)
    if path.parent.name == "custom_algorithm":  # a registered estimator from the example's own module
        assert cfg.algorithm.adv_estimator == "median_baseline" and cfg.algorithm.needs_group
        assert cfg.algorithm.custom_module == str(path.parent / "my_algo.py")
        assert not cfg.algorithm.needs_critic
        return
    expected = AdvantageEstimator.GAE if path.parent.name.startswith("ppo") else AdvantageEstimator.GRPO
    assert cfg.algorithm.adv_estimator is expected
    assert cfg.algorithm.needs_critic == (expected is AdvantageEstimator.GAE)


@pytest.mark.parametrize("quick", [False, True])
# the vision demo's SFT side is not the config's `sft` section (tests/cli/test_demo_vision.py)
@pytest.mark.parametrize("task", sorted(set(DEMOS) - {"vision"}))
def test_demo_config_validates_and_matches_its_sft_set(task: str, quick: bool) -> None:
    cfg = demo_config([], seed=3, quick=quick, task=task)
    # the SFT examples and the RL prompts come from the same task, with the same held-out problems
    assert cfg.sft.builtin.task.value == cfg.data.builtin_task.value == task
    assert cfg.rollout.multi_turn.enable == (task == "calculator")
    assert cfg.sft.builtin.digits == cfg.data.builtin_digits
    assert cfg.sft.builtin.val_size == cfg.data.builtin_val_size
    assert cfg.sft.seed == cfg.data.seed == cfg.trainer.seed == 3


@pytest.mark.parametrize(
    ("name", "mode"), [("sync_separate", "sync"), ("one_step_off", "one_step_off"), ("config", "async")]
)
def test_async_examples_put_the_rollout_on_its_own_pool(name: str, mode: str) -> None:
    path = Path(__file__).parents[2] / "examples" / "async_grpo" / f"{name}.yaml"
    cfg = load_config(str(path))
    assert cfg.trainer.mode == mode and cfg.cluster.separate_pools == ("rollout",)
    assert cfg.trainer.sft_warm_start and cfg.cluster.cpus_per_bundle == 1
    assert (cfg.actor.tis_cap > 0) == (mode != "sync")  # the overlapped modes correct off-policy samples


def test_long_context_example_splits_long_rows_over_a_sequence_group(chat_tokenizer: Any) -> None:
    """examples/long_context: long responses of the counting task, packed, one sequence group per pool, room
    for the task's longest prompt (largest numbers) and in the tiny model's positions for the longest row."""
    path = Path(__file__).parents[2] / "examples" / "long_context" / "config.yaml"
    cfg = load_config(str(path))
    assert cfg.data.builtin_task.value == "counting" and cfg.data.max_response_length >= 1024
    assert cfg.model.remove_padding and cfg.model.sequence_parallel_size == cfg.cluster.world_size == 2
    spec = CountingSpec()
    question = CountingProblem(spec.max_start, spec.max_start + spec.max_count - 1).question
    chat = [{"role": "user", "content": question}]
    prompt = chat_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert len(chat_tokenizer.encode(prompt, add_special_tokens=False)) <= cfg.data.max_prompt_length
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    assert cfg.model.tiny.max_position_embeddings >= longest
