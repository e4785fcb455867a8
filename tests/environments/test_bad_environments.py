"""Bad environments fail their row, never the step: an environment that raises, hangs, or answers with the
wrong types ends its trajectory with finish_reason `env_error`, masked out of the loss, the error naming
the environment, the row, the sample and the turn; a rollout batch with such a row still comes back whole,
and the reward computer scores that row as a failure it names (`bad_rows.jsonl`'s source)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from quartet.agents.loops import AgentEnv, AgentRow, run_agent
from quartet.agents.runner import AgentRunner
from quartet.agents.tool_loop import LoopLimits
from quartet.agents.tools.parsing import get_parser
from quartet.agents.trajectory import ChatRenderer
from quartet.config import ConfigError, load_config
from quartet.data.prompts import PromptDataset
from quartet.environments import Environment, EnvRow, ModelTurn, StepResult, register_environment
from quartet.environments.loop import check_environment_config
from quartet.environments.scoring import compute_score
from quartet.rewards.compute import RewardComputer
from quartet.rewards.rules.registry import select_scorer
from quartet.rollout.types import FinishReason, GenerationOutput, SamplingParams
from quartet.tasks.rows import rl_row

CLOSED: list[str] = []


@register_environment("seam_bad")
class Misbehaving(Environment):
    """Fails in the way its `mode` names; well behaved otherwise (one turn, reward 1)."""

    def __init__(self, mode: str = "", fail_sample: int = -1) -> None:
        if mode == "ctor_raises":
            raise RuntimeError("cannot build")
        self.mode = mode
        self.fail_sample = fail_sample

    async def reset(self, row: EnvRow) -> Any:
        self.sample = row.sample
        if self.mode == "reset_raises":
            raise KeyError("no such puzzle")
        if self.mode == "reset_wrong_type":
            return "a prompt as text"
        return list(row.messages)

    async def step(self, turn: ModelTurn) -> Any:
        mode = self.mode if self.fail_sample in (-1, self.sample) else ""
        answers: dict[str, Any] = {
            "step_dict": {"reward": 1.0},
            "reward_nan": StepResult(reward=math.nan, done=True),
            "reward_text": StepResult(reward="1", done=True),  # type: ignore[arg-type]
            "no_content": StepResult(messages=[{"role": "user"}]),
            "assistant_role": StepResult(messages=[{"role": "assistant", "content": "I answer myself"}]),
            "info_text": StepResult(reward=1.0, done=True, info={"note": "fine"}),
        }
        if mode == "step_raises":
            raise ValueError("the checker crashed")
        if mode == "slow_step":
            await asyncio.sleep(30)
        return answers.get(mode, StepResult(reward=1.0, done=True))

    async def close(self) -> None:
        CLOSED.append(self.mode)


@register_environment("seam_blocking")
class Blocking(Environment):
    """A plain (synchronous) step that blocks past the timeout: run in a thread, it cannot stall the loop."""

    async def reset(self, row: EnvRow) -> list[dict[str, Any]]:
        return list(row.messages)

    finished = threading.Event()

    def step(self, turn: ModelTurn) -> StepResult:  # type: ignore[override]
        time.sleep(5.0)
        Blocking.finished.set()
        return StepResult(reward=1.0, done=True)


class OneTurn:
    """A policy writing 'hello' each turn."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.ids = renderer.encode("hello" + renderer.end_of_turn)

    async def __call__(self, prompt_ids: list[int], budget: int, /, **_: Any) -> GenerationOutput:
        return GenerationOutput("r", 0, tuple(self.ids), tuple([-0.5] * len(self.ids)), FinishReason.STOP)

    async def tokens(self, prompt_ids: Any, sampling: Any, /, **_: Any) -> list[GenerationOutput]:
        return [await self(list(prompt_ids), sampling.max_new_tokens)]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def agent_env(tokenizer: Any, timeout_s: float = 5.0) -> AgentEnv:
    plain = ChatRenderer(tokenizer)
    limits = LoopLimits(max_assistant_turns=3, max_response_tokens=64)
    return AgentEnv(plain, plain, get_parser("hermes"), {}, {}, limits, env_timeout_s=timeout_s)


CASES = [
    ("ctor_raises", "construct", "building it raised RuntimeError: cannot build"),
    ("reset_raises", "reset", "reset raised KeyError: 'no such puzzle'"),
    ("reset_wrong_type", "reset", "reset's answer must be a list of chat messages, got str"),
    ("step_raises", "step of turn 0", "step raised ValueError: the checker crashed"),
    (
        "step_dict",
        "step of turn 0",
        "step must return a StepResult (quartet.environments.StepResult), got dict",
    ),
    ("reward_nan", "step of turn 0", "step.reward must be a finite number or None, got float nan"),
    ("reward_text", "step of turn 0", "step.reward must be a finite number or None, got str '1'"),
    ("no_content", "step of turn 0", "step.messages[0]['content'] must be a string, got NoneType"),
    ("assistant_role", "step of turn 0", "step.messages[0]['role'] must be one of user, tool, system"),
    ("info_text", "step of turn 0", "step.info['note'] must be a finite number, got str 'fine'"),
    ("slow_step", "step of turn 0", "step did not return within rollout.multi_turn.env_timeout_s=0.3s"),
]


@pytest.mark.parametrize(("mode", "stage", "problem"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_environment_fails_its_row_naming_where(
    tokenizer: Any, mode: str, stage: str, problem: str
) -> None:
    CLOSED.clear()
    row = AgentRow(
        [{"role": "user", "content": "hi"}],
        "environment",
        env_kwargs={"name": "seam_bad", "mode": mode},
        index=5,
    )
    env = agent_env(tokenizer, timeout_s=0.3)
    t = asyncio.run(run_agent(row, OneTurn(env.plain_renderer), env))
    assert t.finish_reason == "env_error"
    assert t.error.startswith(f"environment 'seam_bad', row 5, sample 0, {stage}: {problem}"), t.error
    assert not any(t.response_mask) and t.reward is None  # nothing of it is trained
    assert t.metrics["env/errors"] == 1.0
    assert t.metrics["env/timeouts"] == float(mode == "slow_step")
    assert ([] if mode == "ctor_raises" else [mode]) == CLOSED  # close ran however it ended
    assert t.prompt_ids == env.plain_renderer.prompt_ids([{"role": "user", "content": "hi"}])


def test_a_blocking_plain_step_times_out_without_stalling_the_others(tokenizer: Any) -> None:
    env = agent_env(tokenizer, timeout_s=0.3)
    policy = OneTurn(env.plain_renderer)
    rows = [
        AgentRow([{"role": "user", "content": "hi"}], "environment", env_kwargs={"name": name}, index=i)
        for i, name in enumerate(["seam_blocking", "seam_bad", "seam_bad"])
    ]

    async def all_rows() -> list[Any]:
        return list(await asyncio.gather(*(run_agent(r, policy, env) for r in rows)))

    blocked, *fine = asyncio.run(all_rows())
    assert not Blocking.finished.is_set()  # the rollout (asyncio.run included) did not wait for the thread
    assert blocked.finish_reason == "env_error" and "env_timeout_s=0.3s" in blocked.error
    assert [t.reward for t in fine] == [1.0, 1.0] and all(t.finish_reason == "env_done" for t in fine)


def test_unknown_names_fail_at_once_listing_the_registered(tokenizer: Any) -> None:
    cfg = load_config(None, ["rollout.multi_turn.enable=true", "rollout.multi_turn.environment=seam_bda"])
    with pytest.raises(ConfigError) as info:
        check_environment_config(cfg.rollout.multi_turn)
    assert info.value.field == "rollout.multi_turn.environment"
    assert "did you mean 'seam_bad'?" in str(info.value) and "seam_blocking" in str(info.value)
    row = AgentRow([{"role": "user", "content": "hi"}], "environment", env_kwargs={"name": "nope"}, index=2)
    env = agent_env(tokenizer)
    with pytest.raises(ValueError, match=r"row 2: extra_info\.env_kwargs\.name: unknown environment 'nope'"):
        asyncio.run(run_agent(row, OneTurn(env.plain_renderer), env))
    unnamed = AgentRow([{"role": "user", "content": "hi"}], "environment", index=4)
    with pytest.raises(ValueError, match="row 4 runs the environment loop but names no environment"):
        asyncio.run(run_agent(unnamed, OneTurn(env.plain_renderer), env))


def test_env_rows_are_scored_by_the_episode_reward() -> None:
    assert select_scorer("env/anything") is compute_score
    assert compute_score("env/x", "text", None, {"env_reward": 0.75}) == 0.75
    with pytest.raises(ValueError, match="the environment failed this row: boom"):
        compute_score("env/x", "text", None, {"env_reward": None, "env_error": "boom"})
    assert compute_score("env/x", "text", None, {"env_reward": None}) == 0.0  # counted by the loop
    with pytest.raises(ValueError, match="no agent loop ran this row: set rollout.multi_turn.enable=true"):
        compute_score("env/x", "text", None, {"split": "train"})


def test_a_batch_with_a_bad_row_comes_back_whole_and_the_row_is_named(tiny_model_dir: Path) -> None:
    cfg = load_config(
        None,
        [
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.default_agent=environment",
            "rollout.multi_turn.environment=seam_bad",
            "rollout.n=2",
            "data.max_prompt_length=96",
            "data.max_response_length=16",
        ],
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [
        rl_row([{"role": "user", "content": f"q{i}"}], "env/seam_bad", "-", index=i, split="t")
        for i in range(2)
    ]
    rows[1]["extra_info"]["env_kwargs"] = {"mode": "step_raises", "fail_sample": 1}
    prompts = PromptDataset.from_rows(rows, cfg.data, tokenizer, "rows").batch([0, 1])
    runner = AgentRunner.from_config(cfg.rollout.multi_turn, tokenizer, cfg.data.max_response_length)
    sampling = SamplingParams(max_new_tokens=16, n=2, seed=1)
    batch = runner.run(prompts, sampling, OneTurn(runner.env.plain_renderer).tokens, tokenizer.pad_token_id)

    assert len(batch) == 4
    assert list(batch.non_tensors["finish_reason"]) == ["env_done", "env_done", "env_done", "env_error"]
    assert (
        batch["response_mask"].sum(-1).tolist()[3] == 0
        and min(batch["response_mask"].sum(-1).tolist()[:3]) > 0
    )
    errors = [e.get("env_error") for e in batch.non_tensors["extra_info"]]
    assert errors[:3] == [None, None, None]
    assert errors[3].startswith(
        "environment 'seam_bad', row 1, sample 1, step of turn 0: step raised ValueError"
    )
    with RewardComputer(cfg.reward, tokenizer, cfg.data.max_response_length) as reward:
        scored, metrics = reward.score(batch)
        failures = reward.take_failures()
    assert scored["scores"].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert metrics["reward/error_count"] == 1
    (failure,) = failures
    assert failure.row == 1 and failure.position == 3 and "step raised ValueError" in failure.reason
