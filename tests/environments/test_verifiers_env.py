"""verifiers environments through the environment seam, turn by turn: three environments written in verifiers'
own style (tests/environments/verifiers_envs: single-turn with a two-function rubric, multi-turn with
`env_response` hints and a stop condition, a `ToolEnv` with a python function) played by a scripted policy
over the tiny model's real tokenizer in the generic loop `environment`. Each reward is checked against
verifiers' own rubric scoring the same completion (and the weighted sum by hand); the masks, the
environment's messages and the tool's result as the model saw them; then the errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import signal
from pathlib import Path
from typing import Any

import pytest

from quartet.agents.loops import AgentEnv, AgentRow
from quartet.agents.runner import AgentRunner
from quartet.agents.trajectory import AgentFinishReason, ChatRenderer, Trajectory
from quartet.config import load_config
from quartet.environments import Environment, EnvRow, ModelTurn, StepResult, register_environment
from quartet.environments.loop import environment_loop
from quartet.environments.verifiers_env import VerifiersLoadError, load, rows
from quartet.models.loading import load_tokenizer
from quartet.rollout.types import FinishReason, GenerationOutput

ENVS = Path(__file__).parent / "verifiers_envs"


@pytest.fixture(scope="module", autouse=True)
def _fixture_envs_importable() -> Any:
    """The fixtures' folder on sys.path, as an installed environment package would be; verifiers imported
    once here (it takes seconds)."""
    import sys

    import verifiers.legacy  # noqa: F401

    sys.path.insert(0, str(ENVS))
    yield
    sys.path.remove(str(ENVS))


@pytest.fixture(scope="module")
def agent_env(tiny_model_dir: Path) -> AgentEnv:
    cfg = load_config(None, ["rollout.multi_turn.enable=true", "rollout.multi_turn.max_assistant_turns=6"])
    return AgentRunner.from_config(cfg.rollout.multi_turn, load_tokenizer(str(tiny_model_dir)), 1024).env


class Scripted:
    """The next scripted turn's tokens, end-of-turn appended (so what the model wrote is known)."""

    def __init__(self, renderer: ChatRenderer, turns: list[str]) -> None:
        self.renderer, self.turns = renderer, list(turns)

    async def __call__(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        ids = self.renderer.encode(self.turns.pop(0) + self.renderer.end_of_turn)[:max_new_tokens]
        return GenerationOutput("r", 0, tuple(ids), tuple(-0.5 for _ in ids), FinishReason.STOP)


def _play(env: AgentEnv, row: dict[str, Any], turns: list[str]) -> Trajectory:
    info = row["extra_info"]
    agent_row = AgentRow(
        messages=row["prompt"],
        agent_name="environment",
        env_kwargs=info["env_kwargs"],
        data_source=row["data_source"],
        ground_truth=row["reward_model"]["ground_truth"],
        extra_info=info,
        index=info["index"],
    )
    return asyncio.run(environment_loop(agent_row, Scripted(env.plain_renderer, turns), env))


def _turn_texts(env: AgentEnv, traj: Trajectory) -> list[tuple[str, str, set[int]]]:
    """(role, decoded text, its mask values) per turn of the response."""
    decode = env.plain_renderer.tokenizer.decode
    return [
        (t.role, decode(traj.response_ids[t.start : t.stop]), set(traj.response_mask[t.start : t.stop]))
        for t in traj.turns
    ]


def _verifiers_score(
    env_id: str, env_args: dict[str, Any], row: dict[str, Any], completion: list[dict]
) -> Any:
    """verifiers' own rubric on `completion` for the row's dataset entry (a state built here, by hand)."""
    import verifiers as vf

    vf_env = load(env_id, env_args)
    example = json.loads(row["extra_info"]["env_kwargs"]["example"])
    state = vf.State(input={**example, "prompt": row["prompt"]})
    state["prompt"] = row["prompt"]
    state["completion"] = completion
    assistant = [m for m in completion if m["role"] == "assistant"]
    state["trajectory"] = [{"completion": [m]} for m in assistant]
    asyncio.run(vf_env.rubric.score_rollout(state))
    return state


def test_single_turn_reward_is_the_rubrics_weighted_sum(agent_env: AgentEnv) -> None:
    args = {"num_examples": 3, "concise_weight": 0.5}
    row = rows("quartet-vf-single", args)[1]  # What is 2 + 3?
    for text, correct, concise in (("5", 1.0, 1.0), ("I think it is maybe 6 or so", 0.0, 0.25)):
        traj = _play(agent_env, row, [text, "never asked"])
        assert traj.finish_reason is AgentFinishReason.ENV_DONE and traj.assistant_turns == 1
        state = _verifiers_score("quartet-vf-single", args, row, [{"role": "assistant", "content": text}])
        assert traj.reward == pytest.approx(state["reward"])
        assert state["reward"] == pytest.approx(correct + 0.5 * concise)  # the weights, by hand
        assert traj.turn_rewards == [traj.reward]
        assert traj.metrics["env/correct_answer"] == correct and traj.metrics["env/concise"] == concise
        assert traj.metrics["env/num_turns"] == 1.0  # verifiers' own monitor rubric, as a metric
        ((role, said, mask),) = _turn_texts(agent_env, traj)
        assert role == "assistant" and said.startswith(text) and mask == {1}
    prompt = agent_env.plain_renderer.tokenizer.decode(traj.prompt_ids)
    assert "Answer with the number only." in prompt and "What is 2 + 3?" in prompt


def test_multi_turn_env_response_answers_until_the_stop_condition(agent_env: AgentEnv) -> None:
    row = rows("quartet-vf-multi")[0]  # pear
    traj = _play(agent_env, row, ["apple", "peach?", "It is pear", "unused"])
    assert traj.finish_reason is AgentFinishReason.ENV_DONE and traj.assistant_turns == 3
    turns = _turn_texts(agent_env, traj)
    assert [(r, m) for r, _, m in turns] == [("assistant", {1}), ("user", {0})] * 2 + [("assistant", {1})]
    assert "No. Hint 1: it starts with p." in turns[1][1] and "No. Hint 2: it starts with pe." in turns[3][1]
    completion = [
        {"role": "assistant", "content": "apple"},
        {"role": "user", "content": "No. Hint 1: it starts with p."},
        {"role": "assistant", "content": "peach?"},
        {"role": "user", "content": "No. Hint 2: it starts with pe."},
        {"role": "assistant", "content": "It is pear"},
    ]
    state = _verifiers_score("quartet-vf-multi", {}, row, completion)
    assert traj.reward == pytest.approx(state["reward"])
    assert state["reward"] == pytest.approx(1.0 + 0.25 / 3)
    assert traj.turn_rewards == [0.0, 0.0, traj.reward]  # the rubric scores the episode at its end
    # never guessed: the env's max_turns (3) ends it, and the rubric still scores it
    traj = _play(agent_env, row, ["fig", "date", "lemon", "unused"])
    assert traj.finish_reason is AgentFinishReason.ENV_DONE and traj.assistant_turns == 3
    assert traj.reward == pytest.approx(0.25 / 3) and traj.metrics["env/found"] == 0.0


def test_tool_env_runs_its_python_function_and_answers_by_call_id(agent_env: AgentEnv) -> None:
    row = rows("quartet-vf-tool")[0]  # 2 + 3
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    traj = _play(agent_env, row, [call, "The sum is 5.", "unused"])
    assert traj.finish_reason is AgentFinishReason.ENV_DONE and traj.assistant_turns == 2
    turns = _turn_texts(agent_env, traj)
    assert [(r, m) for r, _, m in turns] == [("assistant", {1}), ("tool", {0}), ("assistant", {1})]
    assert "5" in turns[1][1]
    tool_message = traj.messages[-2]
    assert tool_message == {"role": "tool", "content": "5", "tool_call_id": "call_0_0", "name": "add"}
    assert "add(a, b)" in agent_env.plain_renderer.tokenizer.decode(traj.prompt_ids)  # the tool, shown
    completion = [
        {"role": "assistant", "content": call,
         "tool_calls": [{"id": "call_0_0", "name": "add", "arguments": '{"a": 2, "b": 3}'}]},
        {"role": "tool", "content": "5", "tool_call_id": "call_0_0"},
        {"role": "assistant", "content": "The sum is 5."},
    ]  # fmt: skip
    import verifiers as vf

    state = _verifiers_score(
        "quartet-vf-tool", {}, row, vf.utils.message_utils.normalize_messages(completion)
    )
    assert traj.reward == pytest.approx(state["reward"])
    assert state["reward"] == 2.0
    assert traj.metrics["env/add_calls"] == 1.0 and traj.metrics["env/total_tool_calls"] == 1.0


def test_a_rubric_that_raises_fails_the_row_and_a_bad_id_is_named(agent_env: AgentEnv) -> None:
    row = rows("quartet-vf-single", {"fail": True})[0]
    traj = _play(agent_env, row, ["3"])
    assert traj.finish_reason is AgentFinishReason.ENV_ERROR and traj.reward is None
    assert "its rubric failed" in traj.error and "concise" in traj.error and "no_such_field" in traj.error
    assert "environment 'verifiers', row 0" in traj.error and set(traj.response_mask) == {0}
    with pytest.raises(VerifiersLoadError, match=r"'quartet-vf-nowhere'.*module 'quartet_vf_nowhere'"):
        load("quartet-vf-nowhere")
    with pytest.raises(VerifiersLoadError, match=r"TypeError.*load_environment"):
        load("quartet-vf-tool", {"no_such_arg": 1})
    with pytest.raises(VerifiersLoadError, match=r"'quartet-vf-group'.*group reward functions"):
        load("quartet-vf-group")
    # a row of a bad id fails its episode (constructing it), naming the id, not the run
    bad = {
        **row,
        "extra_info": {
            **row["extra_info"],
            "env_kwargs": {"name": "verifiers", "env_id": "quartet-vf-nowhere"},
        },
    }
    traj = _play(agent_env, bad, ["3"])
    assert traj.finish_reason is AgentFinishReason.ENV_ERROR and "'quartet-vf-nowhere'" in traj.error
    # verifiers' constructor would install SIGINT/SIGTERM handlers that exit: this process keeps its own
    handlers = [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)]
    load("quartet-vf-tool", {"max_turns": 2})  # a new load
    assert [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)] == handlers


def test_rows_round_trip_through_parquet(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from quartet.tasks.rows import write_parquet

    train = rows("quartet-vf-single", {"num_examples": 4}, count=3)
    assert [r["reward_model"]["ground_truth"] for r in train] == ["3", "5", "7"]
    back = pq.read_table(write_parquet(train, tmp_path / "rl.parquet")).to_pylist()
    assert back == train and all(math.isfinite(r["extra_info"]["index"]) for r in back)
    kwargs = back[2]["extra_info"]["env_kwargs"]
    assert kwargs["name"] == "verifiers" and json.loads(kwargs["env_args"]) == {"num_examples": 4}
    assert json.loads(kwargs["example"])["info"] == {"a": 3}
    with pytest.raises(ValueError, match=r"'quartet-vf-single', train row 0, column 'blob': .*bytes"):
        rows("quartet-vf-single", {"blob": True})


def test_an_episode_quartets_limit_ends_is_still_scored_by_the_rubric(agent_env: AgentEnv) -> None:
    row = rows("quartet-vf-multi", {"max_turns": 5})[1]  # plum; the env would allow 5 guesses
    two_turns = dataclasses.replace(
        agent_env, limits=dataclasses.replace(agent_env.limits, max_assistant_turns=2)
    )
    traj = _play(two_turns, row, ["fig", "date", "unused"])
    assert traj.finish_reason is AgentFinishReason.ENV_DONE and traj.assistant_turns == 2
    completion = [
        {"role": "assistant", "content": "fig"},
        {"role": "user", "content": "No. Hint 1: it starts with p."},
        {"role": "assistant", "content": "date"},
    ]
    state = _verifiers_score("quartet-vf-multi", {"max_turns": 5}, row, completion)
    assert traj.reward == pytest.approx(state["reward"]) and state["reward"] == pytest.approx(0.25 / 2)
    assert traj.turn_rewards == [0.0, traj.reward]  # the last turn allowed came as final: scored then
    # the token budget: a turn it cuts is scored by `step` (the turn comes cut and final), and a budget the
    # hint fills to the last token ends the episode with no model turn after it: scored by the `end` hook
    hint_end = _play(agent_env, row, ["fig", "date", "kiwi", "lime", "pear"]).turns[1].stop
    done, spent = AgentFinishReason.ENV_DONE, AgentFinishReason.MAX_TOKENS
    for budget, turns, reason in ((hint_end + 2, 2, done), (hint_end, 1, spent)):
        limits = dataclasses.replace(agent_env.limits, max_response_tokens=budget)
        traj = _play(dataclasses.replace(agent_env, limits=limits), row, ["fig", "date", "unused"])
        assert traj.finish_reason is reason and traj.assistant_turns == turns
        assert traj.reward == pytest.approx(0.25 / turns)
        assert traj.turn_rewards == [0.0] * (turns - 1) + [traj.reward]


@register_environment("vf_tests_end_raises")
class _EndRaises(Environment):
    """Never says done; its `end` hook raises: the row fails naming the hook and the limit that ended it."""

    async def reset(self, row: EnvRow) -> list[dict[str, Any]]:
        return row.messages

    async def step(self, turn: ModelTurn) -> StepResult:
        return StepResult(messages=[{"role": "user", "content": "again"}], reward=0.5)

    async def end(self, finish_reason: str) -> StepResult:
        raise RuntimeError(f"cannot score after {finish_reason}")


def test_the_end_hook_fails_the_row_like_a_step(agent_env: AgentEnv) -> None:
    row = {
        "prompt": [{"role": "user", "content": "go"}],
        "data_source": "env/vf_tests_end_raises",
        "reward_model": {"ground_truth": ""},
        "extra_info": {"index": 7, "env_kwargs": {"name": "vf_tests_end_raises"}},
    }
    limits = dataclasses.replace(agent_env.limits, max_assistant_turns=2)
    traj = _play(dataclasses.replace(agent_env, limits=limits), row, ["a", "b", "c"])
    assert traj.finish_reason is AgentFinishReason.ENV_ERROR and traj.reward is None
    assert (
        "row 7, sample 0, end (max_turns): end raised RuntimeError: cannot score after max_turns"
        in traj.error
    )
