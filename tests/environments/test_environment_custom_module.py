"""A user's environment and agent loop from `algorithm.custom_module`: trained on by GRPO for 2 steps (the
driver and the rollout import the module; rows name the environment; the environment's reward is the
score), and run by a rollout replica in a Ray worker that imported the module on its own."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.config import load_config
from quartet.data.prompts import PromptDataset
from quartet.environments import registered_environments
from quartet.models.loading import load_tokenizer
from quartet.roles.rollout import Rollout
from quartet.tasks.rows import rl_row
from quartet.trainer import RLTrainer
from quartet.trainer.workers.start import run_values

USER_MODULE = textwrap.dedent(
    """
    import os

    from quartet.environments import Environment, StepResult, register_environment
    from quartet.environments.loop import environment_loop
    from quartet.agents.loops import register_agent_loop


    @register_environment("say_digit")
    class SayDigit(Environment):
        '''Two tries to write the row's digit: 1 for the first, 0.5 for the second, a hint between.'''

        def __init__(self, tries: int = 2):
            self.tries = tries

        async def reset(self, row):
            self.digit = str(row.ground_truth)
            return list(row.messages)

        async def step(self, turn):
            right = self.digit in turn.text
            last = turn.final or turn.turn + 1 >= self.tries
            info = {"pid": float(os.getpid()), "tries": float(self.tries)}
            if right or last:
                return StepResult(reward=(1.0 / (turn.turn + 1)) if right else 0.0, done=True, info=info)
            hint = [{"role": "user", "content": f"No. Write {self.digit}."}]
            return StepResult(messages=hint, reward=0.0, info=info)  # 0, not None: the hint may end it


    @register_agent_loop("marked_environment")
    async def marked_environment(row, generate, env):
        trajectory = await environment_loop(row, generate, env)
        trajectory.metrics["custom/marked"] = 1.0
        return trajectory
    """
)


def write_rows(path: Path, count: int) -> Path:
    rows = [
        rl_row(
            [{"role": "user", "content": f"Write the digit {i % 10}."}],
            "env/say_digit",
            str(i % 10),
            index=i,
            split="train",
            extra={"env_kwargs": {"name": "say_digit", "tries": 2}},
        )
        for i in range(count)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture(scope="module")
def user_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's module, one file for the whole module: a second file registering the same names is
    refused (a name is registered once per process)."""
    module = tmp_path_factory.mktemp("user") / "user_env.py"
    module.write_text(USER_MODULE)
    return module


def settings(module: Path) -> list[str]:
    return [
        f"algorithm.custom_module={module}",
        "rollout.multi_turn.enable=true",
        "rollout.multi_turn.default_agent=marked_environment",
        "rollout.multi_turn.max_assistant_turns=2",
        "data.max_prompt_length=64",
        "data.max_response_length=24",
    ]


def test_grpo_on_a_custom_module_environment(user_module: Path, tmp_path: Path) -> None:
    train = write_rows(tmp_path / "train.parquet", 16)
    cfg = load_config(
        None,
        [
            *settings(user_module),
            "cluster.backend=local",
            f"data.train_files=[{train}]",
            f"data.val_files=[{train}]",
            "data.train_batch_size=4",
            "rollout.n=4",
            "actor.mini_batch_size=4",
            "actor.micro_batch_size_per_device=16",
            "trainer.total_steps=2",
            "trainer.test_freq=0",
            "trainer.rollout_freq=1",
            "trainer.rollout_samples=16",
            f"trainer.output_dir={tmp_path}",
        ],
    )
    assert "say_digit" in registered_environments()  # the driver imported the module
    records: list[dict[str, Any]] = []
    result = RLTrainer(cfg, on_record=records.append).run()
    assert result.steps == 2
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 2
    for m in steps:
        assert m["custom/marked/mean"] == 1.0 and m["env/tries/mean"] == 2.0  # the user's loop and env ran
        assert m["env/errors/mean"] == 0.0 and m["reward/error_count"] == 0
        assert m["env/unrewarded/mean"] == 0.0  # a cut turn is final: the environment rewards it
        assert 1.0 <= m["env/steps/mean"] <= 2.0
    # each recorded score is the environment's reward for what the record shows the model wrote
    records_1 = [
        json.loads(x) for x in (result.run_dir / "rollouts" / "step_1.jsonl").read_text().splitlines()
    ]
    assert records_1
    for rec in records_1:
        turns = [t for t in rec["turns"] if t["role"] == "assistant"]
        digit = str(rec["ground_truth"])
        hit = next((k for k, t in enumerate(turns) if digit in t["text"]), None)
        expected = 0.0 if hit is None else 1.0 / (hit + 1)
        if rec.get("finish_reason") == "max_tokens" and hit is None:
            continue  # cut mid-turn: the environment judged the cut text, the record's may differ at the cut
        assert rec["score"] == pytest.approx(expected), rec


@pytest.mark.ray
@pytest.mark.slow  # the same import path as a custom agent loop's, which tests/agents runs in CI
def test_a_custom_module_environment_runs_in_a_rollout_worker(
    ray_cluster: None, tiny_model_dir: Path, user_module: Path, tmp_path: Path
) -> None:
    cfg = load_config(None, [*settings(user_module), "rollout.n=2"])
    rows = pd.read_parquet(write_rows(tmp_path / "rows.parquet", 2)).to_dict("records")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    prompts = (
        PromptDataset.from_rows(rows, cfg.data, tokenizer, "rows").batch([0, 1]).with_meta(global_step=1)
    )
    pool = ResourcePool(1, 1, 0.5, use_gpu=False, timeout_s=60).create()
    hosts = colocate(
        pool,
        RunNames("quartet-tests", "user-environment"),
        label="rl",
        rollout=RoleSpec(Rollout, cfg.rollout, run_values(cfg, str(tiny_model_dir))),
    )
    try:
        batch = hosts.groups["rollout"].generate(prompts)
    finally:
        hosts.shutdown()
    metrics = list(batch.non_tensors["agent_metrics"])
    assert len(metrics) == 4 and all(m["custom/marked"] == 1.0 for m in metrics)
    assert {m["env/pid"] for m in metrics} != {float(os.getpid())}  # the worker imported the module itself
    extra = list(batch.non_tensors["extra_info"])
    assert all(e["env_reward"] in (0.0, 0.5, 1.0) for e in extra)
