"""The environment seam, turn by turn: hand-written environments run by the generic `environment` agent
loop over the tiny model's real tokenizer and chat template, with a scripted policy (so every turn is
known): the prompts the model saw, masks, the environment's messages as rendered tokens, rewards per turn
and in sum, done, tool calls with their ids, a turn cut by the token limit; then the registry's errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from quartet.agents.loops import AgentEnv, AgentRow, run_agent
from quartet.agents.tool_loop import LoopLimits
from quartet.agents.tools.parsing import get_parser
from quartet.agents.trajectory import ChatRenderer, Trajectory
from quartet.environments import Environment, EnvRow, ModelTurn, StepResult, register_environment
from quartet.environments.registry import UnknownEnvironmentError, make_environment
from quartet.rollout.types import FinishReason, GenerationOutput

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "the value of a key",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    },
}


@register_environment("seam_guess")
class GuessWord(Environment):
    """The model must say the row's word: a wrong turn gets a hint and 0.25 for trying, the right one 1."""

    seen: list[ModelTurn]

    def __init__(self, hint: str = "Try again.") -> None:
        self.hint = hint
        self.seen = []
        GuessWord.last = self

    async def reset(self, row: EnvRow) -> list[dict[str, Any]]:
        self.word = str(row.ground_truth)
        self.row = row
        return [{"role": "system", "content": "Guess the word."}, *row.messages]

    async def step(self, turn: ModelTurn) -> StepResult:
        self.seen.append(turn)
        if self.word in turn.text:
            return StepResult(reward=1.0, done=True, info={"guesses": turn.turn + 1})
        return StepResult(messages=[{"role": "user", "content": self.hint}], reward=0.25)


@register_environment("seam_lookup")
class Lookup(Environment):
    """A tool environment: answers `lookup` calls from a table (a plain, synchronous step)."""

    table = {"a": "42", "b": "7"}

    def __init__(self) -> None:
        Lookup.last = self
        self.closed = False

    async def reset(self, row: EnvRow) -> list[dict[str, Any]]:
        return list(row.messages)

    def tools(self) -> list[dict[str, Any]]:
        return [LOOKUP]

    def step(self, turn: ModelTurn) -> StepResult:  # type: ignore[override]  (plain def: run in a thread)
        self.turn = turn
        if not turn.tool_calls:
            return StepResult(reward=float("42" in turn.text), done=True)
        replies = [
            {"role": "tool", "name": c.name, "tool_call_id": c.id, "content": self.table[c.arguments["key"]]}
            for c in turn.tool_calls
        ]
        return StepResult(messages=replies)

    async def close(self) -> None:
        self.closed = True


class ScriptedPolicy:
    """The next scripted turn's tokens (end-of-turn appended, cut to the budget), recording each prompt."""

    def __init__(self, renderer: ChatRenderer, turns: list[str]) -> None:
        self.renderer = renderer
        self.turns = list(turns)
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    async def __call__(self, prompt_ids: list[int], max_new_tokens: int, /, **_: Any) -> GenerationOutput:
        self.prompts.append(list(prompt_ids))
        eot = self.renderer.encode(self.renderer.end_of_turn)
        ids = self.renderer.encode(self.turns.pop(0) + self.renderer.end_of_turn)[:max_new_tokens]
        self.sampled.append(ids)
        reason = FinishReason.STOP if ids[-len(eot) :] == eot else FinishReason.LENGTH
        logprobs = tuple(-0.1 * (i + 1) for i in range(len(ids)))
        return GenerationOutput("r", 0, tuple(ids), logprobs, reason)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def agent_env(tokenizer: Any, max_turns: int = 4, budget: int = 512, **kw: Any) -> AgentEnv:
    plain = ChatRenderer(tokenizer)
    return AgentEnv(
        renderer=plain,
        plain_renderer=plain,
        parser=get_parser("hermes"),
        tools={},
        interactions={},
        limits=LoopLimits(max_assistant_turns=max_turns, max_response_tokens=budget),
        **kw,
    )


def agent_row(name: str, word: str = "apple", index: int = 3, **env_kwargs: Any) -> AgentRow:
    return AgentRow(
        messages=[{"role": "user", "content": "Which fruit?"}],
        agent_name="environment",
        env_kwargs={"name": name, **env_kwargs},
        data_source=f"env/{name}",
        ground_truth=word,
        index=index,
    )


def run(row: AgentRow, policy: ScriptedPolicy, env: AgentEnv) -> Trajectory:
    return asyncio.run(run_agent(row, policy, env))


def model_positions(t: Trajectory) -> list[int]:
    return [i for span in t.turns if span.role == "assistant" for i in range(span.start, span.stop)]


def test_an_environment_turn_by_turn(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    policy = ScriptedPolicy(renderer, ["pear", "plum", "an apple"])
    t = run(agent_row("seam_guess", hint="Not that one."), policy, agent_env(tokenizer))
    env = GuessWord.last

    # reset's messages are the prompt, rendered by the chat template
    first = [{"role": "system", "content": "Guess the word."}, {"role": "user", "content": "Which fruit?"}]
    assert t.prompt_ids == renderer.prompt_ids(first)
    assert env.row.ground_truth == "apple" and env.row.index == 3 and env.row.data_source == "env/seam_guess"
    # every model turn saw exactly everything before it; mask 1 exactly on the sampled tokens
    for span, prompt in zip([s for s in t.turns if s.role == "assistant"], policy.prompts, strict=True):
        assert prompt == t.prompt_ids + t.response_ids[: span.start]
    model = model_positions(t)
    assert [i for i, m in enumerate(t.response_mask) if m] == model
    assert [t.response_ids[i] for i in model] == [x for ids in policy.sampled for x in ids]
    assert all(t.logprobs[i] == 0.0 for i in range(len(t.response_ids)) if i not in set(model))
    # the environment's turns are its messages rendered once after each model turn
    user_spans = [s for s in t.turns if s.role == "user"]
    expected = renderer.env_turn_ids([{"role": "user", "content": "Not that one."}])
    assert [t.response_ids[s.start : s.stop] for s in user_spans] == [expected, expected]
    # what the environment saw: each turn's text and index, the conversation so far
    assert [turn.text for turn in env.seen] == ["pear", "plum", "an apple"]
    assert [turn.turn for turn in env.seen] == [0, 1, 2]
    assert not any(turn.final or turn.cut for turn in env.seen)  # 4 turns allowed, the budget not spent
    assert env.seen[1].messages[-1] == {"role": "assistant", "content": "plum"}
    roles = ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert [m["role"] for m in env.seen[2].messages] == roles
    # rewards: per turn, and their sum as the episode's; done ends it
    assert t.turn_rewards == [0.25, 0.25, 1.0]
    assert t.reward == pytest.approx(1.5)
    assert t.finish_reason == "env_done"
    assert t.metrics["env/steps"] == 3 and t.metrics["env/guesses"] == 3 and t.metrics["env/errors"] == 0


def test_a_tool_environment_gets_parsed_calls_with_ids(tokenizer: Any) -> None:
    call = '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'
    tooled = ChatRenderer(tokenizer, [LOOKUP])
    policy = ScriptedPolicy(tooled, [call, "It is 42."])
    t = run(agent_row("seam_lookup"), policy, agent_env(tokenizer))
    env = Lookup.last

    assert t.prompt_ids == tooled.prompt_ids([{"role": "user", "content": "Which fruit?"}])  # tools shown
    (first,) = [m for m in t.messages if m.get("tool_calls")]
    assert first["tool_calls"][0]["id"] == "call_0_0"
    tool_span = next(s for s in t.turns if s.role == "tool")
    reply = {"role": "tool", "name": "lookup", "tool_call_id": "call_0_0", "content": "42"}
    assert t.response_ids[tool_span.start : tool_span.stop] == tooled.env_turn_ids([reply])
    assert env.turn.tool_calls == () and env.turn.turn == 1  # the last turn made no call
    assert t.reward == 1.0 and t.finish_reason == "env_done" and env.closed


def test_a_turn_cut_by_the_token_limit_is_still_judged(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    words = "banana " * 40 + "apple"
    budget = len(renderer.encode(words)) // 2
    t = run(agent_row("seam_guess"), ScriptedPolicy(renderer, [words]), agent_env(tokenizer, budget=budget))
    seen = GuessWord.last.seen
    assert len(seen) == 1 and seen[0].cut and seen[0].final  # judged, and told it was cut: the last turn
    assert t.reward == 0.25 and t.finish_reason == "max_tokens" and len(t.response_ids) == budget


def test_an_episode_that_never_ends_stops_at_the_turn_limit(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    t = run(agent_row("seam_guess"), ScriptedPolicy(renderer, ["no"] * 5), agent_env(tokenizer, max_turns=2))
    assert t.finish_reason == "max_turns" and t.assistant_turns == 2 and t.metrics["env/errors"] == 0
    assert [turn.final for turn in GuessWord.last.seen] == [False, True]  # told which turn is the last


def test_registry_errors_list_what_exists() -> None:
    with pytest.raises(UnknownEnvironmentError) as info:
        make_environment("seam_gues", {}, "rollout.multi_turn.environment")
    text = str(info.value)
    assert "unknown environment 'seam_gues'" in text and "did you mean 'seam_guess'?" in text
    assert "seam_lookup" in text and "@register_environment" in text
    with pytest.raises(ValueError, match=r"'seam_guess' is already registered \(by test_environment_seam\)"):
        register_environment("seam_guess")(GuessWord)
    with pytest.raises(TypeError, match="has no step method"):
        register_environment("seam_no_step")(type("NoStep", (), {"reset": lambda self, row: []}))
    with pytest.raises(TypeError, match=r"refused its arguments \['colour'\] from the row"):
        make_environment("seam_guess", {"colour": 1}, "the row")


def test_an_installed_package_offers_an_environment_by_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package installed with an entry point in `quartet.environments` is found by name, no config."""
    (tmp_path / "pkg_env_mod.py").write_text(
        "from quartet.environments import Environment, StepResult\n"
        "class Echo(Environment):\n"
        "    async def reset(self, row):\n        return list(row.messages)\n"
        "    async def step(self, turn):\n"
        "        return StepResult(reward=float(len(turn.text)), done=True)\n"
    )
    dist = tmp_path / "pkg_env-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg-env\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[quartet.environments]\nseam_echo = pkg_env_mod:Echo\nseam_broken = pkg_env_mod:Missing\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_environment("seam_echo", {}, "rollout.multi_turn.environment")
    assert type(env).__name__ == "Echo" and type(env).name == "seam_echo"
    with pytest.raises(UnknownEnvironmentError, match=r"entry point 'pkg_env_mod:Missing' .* failed to load"):
        make_environment("seam_broken", {}, "rollout.multi_turn.environment")
    with pytest.raises(UnknownEnvironmentError, match="did you mean 'seam_echo'"):
        make_environment("seam_ech", {}, "the row")
