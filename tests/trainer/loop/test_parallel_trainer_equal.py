"""Three GRPO steps of `examples/long_context` through the whole trainer (Ray, world 2): sequence parallel 2
and tensor parallel 2 end where data parallel 2 does (issue 36, part 3, with the plumbing: config -> run
values -> roles -> engine).

The world size is the same in every run, so the prompts, the rollouts (same seeds, same rollout engines) and
the rewards are the same; only the actor's sequence (or tensor) split differs. Adam's eps is raised to 1 so
each step is proportional to the gradient (its default makes the first step lr * sign(g), which turns
float32 rounding of near-zero gradients into differences of up to lr). Responses are cut at 256 tokens to
keep the test short; the long-row figures are `benchmarks/long_context.py`'s. A random model never counts
right, so the task's reward is 0 for every response and GRPO's advantages with it; the reward here is the
share of digits in a response instead (`reward.function`), which differs between the responses of a group
and gives every step a gradient.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from quartet.config import load_config
from quartet.trainer import RLTrainer

EXAMPLE = Path(__file__).parents[3] / "examples" / "long_context" / "config.yaml"
pytestmark = [pytest.mark.ray]  # issue 36 asks for this check in CI: not `slow` (3 runs, ~50 s)
SAME = ("response_length/mean", "response_length/max", "critic/score/mean", "prompt_length/mean")


REWARD = """
def digit_share(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))
"""


Run = tuple[dict[str, torch.Tensor], list[dict[str, Any]]]


def _run(sp: int, folder: Path, reward: Path, tp: int = 1) -> Run:
    cfg = load_config(
        str(EXAMPLE),
        [
            f"reward.function={reward}:digit_share",
            f"trainer.output_dir={folder}",
            "trainer.total_steps=3",
            "trainer.save_freq=0",
            "trainer.loggers=[jsonl]",
            "data.max_response_length=256",
            "data.builtin_train_size=16",
            "data.builtin_val_size=4",
            f"model.sequence_parallel_size={sp}",
            f"model.tensor_parallel_size={tp}",
            "actor.optim.eps=1.0",
            "actor.optim.lr=0.1",
            "cluster.namespace=quartet-tests",  # the shared test cluster's namespace
        ],
    )
    assert cfg.cluster.world_size == 2 and cfg.model.sequence_parallel_size == sp
    assert cfg.model.tensor_parallel_size == tp
    result = RLTrainer(cfg).run()
    assert result.steps == 3 and result.hf_dir is not None
    records = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    return AutoModelForCausalLM.from_pretrained(result.hf_dir).state_dict(), steps


@pytest.fixture(scope="module")
def reward(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reward") / "digit_reward.py"
    path.write_text(REWARD)
    return path


@pytest.fixture(scope="module")
def dp2(ray_cluster: None, reward: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(1, tmp_path_factory.mktemp("dp2"), reward)


def _assert_same_run(split: Run, dp2: Run) -> None:
    (dp, dp_steps), (sp, sp_steps) = dp2, split
    assert len(dp_steps) == len(sp_steps) == 3
    for mine, theirs in zip(sp_steps, dp_steps, strict=True):
        assert {k: mine[k] for k in SAME} == {k: theirs[k] for k in SAME}  # the same rollouts
        assert mine["actor/grad_norm"] == pytest.approx(theirs["actor/grad_norm"], rel=1e-5)
    assert all(
        s["actor/grad_norm"] > 1e-4 and s["critic/score/max"] > s["critic/score/min"] for s in dp_steps
    )
    for key, value in dp.items():
        worst = float((sp[key] - value).abs().max())
        assert torch.allclose(sp[key], value, atol=1e-5, rtol=0), (key, worst)


def test_three_grpo_steps_of_the_long_context_example_sp2_equal_dp2(
    dp2: Run, reward: Path, tmp_path: Path
) -> None:
    _assert_same_run(_run(2, tmp_path / "sp2", reward), dp2)


# slow (CI time): the sp2 leg stays in CI; tp2 is held exact at the engine level (test_tensor_parallel_dist)
@pytest.mark.slow
def test_three_grpo_steps_of_the_long_context_example_tp2_equal_dp2(
    dp2: Run, reward: Path, tmp_path: Path
) -> None:
    _assert_same_run(_run(1, tmp_path / "tp2", reward, tp=2), dp2)
