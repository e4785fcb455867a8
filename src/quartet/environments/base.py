"""The environment seam: what an environment is, in one small interface that one generic agent loop runs.

An environment plays one episode per instance, against the model's turns:

    class Countdown(Environment):
        async def reset(self, row: EnvRow) -> list[dict]:
            self.target = int(row.ground_truth)            # from the data row
            return row.messages                            # the first messages (the row's prompt here)

        async def step(self, turn: ModelTurn) -> StepResult:
            if str(self.target) in turn.text:
                return StepResult(reward=1.0, done=True)
            return StepResult(messages=[{"role": "user", "content": "Not yet, count again."}])

`reset` turns a data row into the conversation's first messages. `step` gets each model turn (its text
as the model wrote it, the tool calls the run's parser read in it) and answers with the next messages
(user replies, tool results: they enter the response with mask 0, never the loss), a reward for that
turn, and whether the episode is done. The generic loop (`quartet.environments.loop`, the agent loop
`environment`) does the rest as the built-in tool loop does: rendering, token bookkeeping and masks,
template modes, the token and turn budgets, timeouts, counters. Methods may be `async def` or plain
`def` (a plain one runs in a worker thread, so a slow environment does not stall the others).

Rewards: a step's `reward` goes on the model turn it answers (`turn_rewards`, for turn-level credit) and
`end(finish_reason)`, called when a limit ended the episode before `done`, may add one last reward. The
episode's reward (the trajectory's `env_reward`, which rows with data source `env/<name>` are scored
by) is the sum of every step's reward (None when no step gave one: such a row scores 0 and is counted in
`env/unrewarded`). A turn after which the loop cannot go on (cut at the token limit, the last turn
allowed, no budget left) comes with `ModelTurn.final`: the place for an outcome reward. `info`'s numbers
go to the step's metrics as `env/<key>` (per trajectory the last value given; averaged over the batch).

An environment with tools says so in `tools()` (OpenAI function schemas, read after `reset`): the prompt
shows them, the run's tool-call parser (`rollout.multi_turn.tool_call_format`) reads the model's calls into
`ModelTurn.tool_calls` (each with an id, `call_<turn>_<index>`), and the environment answers with `tool`
messages carrying those ids.

Register an environment by name with `@register_environment` (`quartet.environments.registry`) in the
module named by `algorithm.custom_module` (or any module that module imports); rows choose it with
`extra_info.env_kwargs.name` or `rollout.multi_turn.environment`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EnvRow", "Environment", "ModelTurn", "StepResult", "ToolCall"]


@dataclass(frozen=True)
class EnvRow:
    """What a data row gives an environment's `reset`."""

    messages: list[dict[str, Any]]
    """The row's prompt as chat messages."""
    data_source: str = ""
    ground_truth: Any = None
    extra_info: Mapping[str, Any] = field(default_factory=dict)
    """The row's `extra_info` (its `env_kwargs` included)."""
    index: int | None = None
    """The row's index in its data set (the batch's `index` column), for error messages."""
    sample: int = 0
    """Which of the row's `rollout.n` samples this episode is (0, 1, ...)."""


@dataclass(frozen=True)
class ToolCall:
    """A tool call the run's parser read in a model turn."""

    id: str
    """`call_<turn>_<index>`: a `tool` message answering it carries it as `tool_call_id`."""
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class ModelTurn:
    """One turn the model wrote, as the environment sees it."""

    text: str
    """The decoded turn, special tokens kept, without the end-of-turn token."""
    turn: int
    """Which model turn of the episode (0, 1, ...)."""
    messages: Sequence[Mapping[str, Any]]
    """The conversation so far, this turn last (an assistant message; with `tool_calls` when it made
    calls). Read-only for the environment."""
    tool_calls: tuple[ToolCall, ...] = ()
    """The calls read in `text` (only for an environment with `tools()`)."""
    tool_call_errors: tuple[str, ...] = ()
    """Calls the parser could not read (bad JSON, no name), one line each."""
    cut: bool = False
    """The turn ended at the token limit, not at the model's end-of-turn (its last words may be missing)."""
    final: bool = False
    """No model turn can follow, whatever `step` answers (a cut turn, the last of `max_assistant_turns`,
    or no response budget left): give the episode's outcome reward now."""


@dataclass(frozen=True)
class StepResult:
    """An environment's answer to one model turn."""

    messages: Sequence[Mapping[str, Any]] = ()
    """The next messages (`{"role": "user"|"tool", "content": str, ...}`); none: the model goes again."""
    reward: float | None = None
    """This turn's reward (a finite number), or None."""
    done: bool = False
    """The episode is over: no more model turns."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """Figures for the step's metrics: finite numbers only, each averaged as `env/<key>`."""


class Environment(abc.ABC):
    """One episode per instance (see the module docstring). The registry builds an instance per
    trajectory as `cls(**kwargs)`: the row's `extra_info.env_kwargs` (without `name`) over the run's
    `rollout.multi_turn.environment_kwargs`."""

    name: str = ""
    """The registered name (set by `register_environment`)."""

    @abc.abstractmethod
    async def reset(self, row: EnvRow) -> list[dict[str, Any]]:
        """The conversation's first messages for `row` (often `row.messages`)."""

    @abc.abstractmethod
    async def step(self, turn: ModelTurn) -> StepResult:
        """Answer one model turn."""

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of the environment's tools (shown in the prompt); none by default."""
        return []

    async def end(self, finish_reason: str) -> StepResult:
        """The episode ended without `done` (a turn or token limit, `finish_reason`): a last chance to
        reward it, e.g. an outcome score of the whole conversation (verifiers' rubric). Its reward goes on
        the last model turn; its messages are not shown. Not called after an error or an abort, nor when
        no model turn was made. By default: nothing."""
        return StepResult()

    async def close(self) -> None:  # noqa: B027 (an optional hook: most environments hold nothing)
        """Release what the episode holds; called once, however it ended."""
