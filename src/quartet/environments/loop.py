"""The generic agent loop over an environment: the agent loop `environment` (`agent_name: environment`).

    reset(row) -> first messages -> [model turn -> step(turn) -> next messages, reward, done] ... -> close()

Per trajectory the loop builds the row's environment (`extra_info.env_kwargs.name`, else
`rollout.multi_turn.environment`), renders its first messages (with its `tools()` in the prompt), then
alternates model turns and the environment's answers with the token bookkeeping of the built-in tool
loop (`quartet.agents.tool_loop.Episode`): the model's tokens as generated (mask 1), the environment's
messages rendered once as a delta after them (mask 0) or, with `template_mode: rerender`, the template's
rendering of the conversation; the response budget (`data.max_response_length`) and
`max_assistant_turns` end an episode that does not end itself. A turn cut by the token limit is still
given to `step` (`ModelTurn.cut`), so the environment can score it; the episode then ends.

A bad environment fails its row, never the step. If `reset`, `step` or the constructor raises, a call runs
past `rollout.multi_turn.env_timeout_s`, or an answer has the wrong type (`reset` not a list of messages,
`step` not a `StepResult`, a message without a role or text, a reward that is not a finite number, an
`info` value that is not a number), the trajectory ends with finish_reason `env_error`, its response is
masked out of the loss, and `Trajectory.error` names the environment, the row, the sample, the turn and
the error. It is counted (`env/errors`) and logged, and a row with data source `env/<name>` is scored
as a failed row (`reward/error_count`, named in `bad_rows.jsonl`; `quartet.environments.scoring`).
`close` runs however the episode ended; its failure is counted (`env/close_errors`) but spoils nothing.

Metrics per trajectory: `env/steps`, `env/errors`, `env/timeouts`, `env/close_errors`, `env/unrewarded`
(an episode no step rewarded: its `env/...` row scores 0), each number of a
step's `info` as `env/<key>` (the last value given stands), and the tool loop's `agent/...` counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

from quartet.agents.loops import AgentEnv, AgentRow, register_agent_loop
from quartet.agents.tool_loop import Episode, Generate, TurnText, start_trajectory
from quartet.agents.tools.parsing import ParsedTurn
from quartet.agents.trajectory import AgentFinishReason, ChatRenderer, Trajectory
from quartet.config.errors import ConfigError
from quartet.config.rollout import MultiTurnConfig
from quartet.environments.base import EnvRow, ModelTurn, StepResult, ToolCall
from quartet.environments.registry import (
    UnknownEnvironmentError,
    check_environment,
    known_environments,
    make_environment,
)

__all__ = ["ENVIRONMENT_LOOP", "EnvironmentFailure", "check_environment_config", "environment_loop"]

log = logging.getLogger(__name__)

ENVIRONMENT_LOOP = "environment"
"""The agent loop's name (a row's `agent_name`, or `rollout.multi_turn.default_agent`)."""

_ROLES = ("user", "tool", "system")
"""Roles an environment's messages may have (assistant turns are the model's)."""


class EnvironmentFailure(Exception):
    """An environment call raised, timed out or answered with the wrong types; the message says which."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80] + '...' if len(text) > 80 else text}"


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a daemon thread of its own: a call that never returns is left behind (the timeout
    fails its row) without holding the event loop, nor `asyncio.run`'s exit, which waits for the default
    executor's threads."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def work() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn(*args))
        except BaseException as err:  # noqa: BLE001 (handed to the awaiting task)
            outcome = (False, err)
        with contextlib.suppress(RuntimeError):  # the loop is gone: the call was given up on long ago
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name="quartet-env-call", daemon=True).start()
    return await future


async def _call(fn: Callable[..., Any], arg: Any, what: str, timeout_s: float) -> Any:
    """`fn(arg)` (async, or plain in a worker thread) within `timeout_s`; an `EnvironmentFailure` saying
    `what` failed and how."""
    try:
        async with asyncio.timeout(timeout_s):
            if inspect.iscoroutinefunction(fn):
                return await fn(arg)
            result = await _in_thread(fn, arg)
            return await result if inspect.isawaitable(result) else result
    except TimeoutError:
        raise EnvironmentFailure(
            f"{what} did not return within rollout.multi_turn.env_timeout_s={timeout_s:g}s", timeout=True
        ) from None
    except EnvironmentFailure:
        raise
    except Exception as err:  # the environment is user code: any error fails its row, not the run
        raise EnvironmentFailure(f"{what} raised {type(err).__name__}: {err}") from err


def _messages(value: Any, what: str) -> list[dict[str, Any]]:
    """`value` as chat messages, or an `EnvironmentFailure` naming what is wrong with it."""
    if not isinstance(value, list | tuple):
        raise EnvironmentFailure(f"{what} must be a list of chat messages, got {_describe(value)}")
    out = []
    for k, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise EnvironmentFailure(f"{what}[{k}] must be a message dict, got {_describe(message)}")
        if not isinstance(message.get("content"), str):
            content = message.get("content")
            raise EnvironmentFailure(f"{what}[{k}]['content'] must be a string, got {_describe(content)}")
        out.append(dict(message))
    return out


def _check_step(result: Any, what: str) -> StepResult:
    """`result` when it is a well-formed `StepResult`; an `EnvironmentFailure` naming the bad field."""
    if not isinstance(result, StepResult):
        raise EnvironmentFailure(
            f"{what} must return a StepResult (quartet.environments.StepResult), got {_describe(result)}"
        )
    for k, message in enumerate(_messages(list(result.messages), f"{what}.messages")):
        if message.get("role") not in _ROLES:
            raise EnvironmentFailure(
                f"{what}.messages[{k}]['role'] must be one of {', '.join(_ROLES)}, "
                f"got {message.get('role')!r}"
            )
    reward = result.reward
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
    ):
        raise EnvironmentFailure(f"{what}.reward must be a finite number or None, got {_describe(reward)}")
    if not isinstance(result.done, bool):
        raise EnvironmentFailure(f"{what}.done must be True or False, got {_describe(result.done)}")
    if not isinstance(result.info, Mapping):
        raise EnvironmentFailure(f"{what}.info must be a mapping, got {_describe(result.info)}")
    for key, value in result.info.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise EnvironmentFailure(f"{what}.info[{key!r}] must be a finite number, got {_describe(value)}")
    return result


def _renderer(env: AgentEnv, tools: list[dict[str, Any]]) -> ChatRenderer:
    """The renderer showing `tools` (built once per replica and tool set, kept on `env`)."""
    if not tools:
        return env.plain_renderer
    key = json.dumps(tools, sort_keys=True, default=str)
    if key not in env.renderers:
        env.renderers[key] = ChatRenderer(env.plain_renderer.tokenizer, tools)
    return env.renderers[key]


class _EnvEpisode:
    """One trajectory of the environment loop: the environment, the shared `Episode` bookkeeping, the
    counters, and where an error happened."""

    def __init__(self, row: AgentRow, env: AgentEnv) -> None:
        kwargs = {**env.environment_kwargs, **{k: v for k, v in row.env_kwargs.items() if k != "name"}}
        self.name = str(row.env_kwargs.get("name") or env.environment)
        if not self.name:
            raise UnknownEnvironmentError(
                f"row {row.index} runs the environment loop but names no environment; "
                f"{known_environments()}. Fix: set the row's extra_info.env_kwargs.name or "
                "rollout.multi_turn.environment"
            )
        check_environment(self.name, f"row {row.index}: extra_info.env_kwargs.name")
        self.row = row
        self.env = env
        self.kwargs = kwargs
        self.instance: Any = None
        self.stage = "construct"
        self.counts: dict[str, float] = {"env/steps": 0.0, "env/errors": 0.0, "env/timeouts": 0.0}
        self.reward_total: float | None = None
        self.done = False

    def where(self) -> str:
        return f"environment {self.name!r}, row {self.row.index}, sample {self.row.sample}, {self.stage}"

    async def start(self) -> tuple[Trajectory, Episode]:
        """Build the environment, reset it, and start the trajectory on its first messages."""
        try:
            self.instance = make_environment(self.name, self.kwargs, "the row's extra_info.env_kwargs")
        except UnknownEnvironmentError:
            raise
        except TypeError as err:
            raise EnvironmentFailure(str(err)) from err
        except Exception as err:  # a constructor that fails on this row's arguments
            raise EnvironmentFailure(f"building it raised {type(err).__name__}: {err}") from err
        self.stage = "reset"
        row = self.row
        env_row = EnvRow(
            row.messages, row.data_source, row.ground_truth, row.extra_info, row.index, row.sample
        )
        first = _messages(
            await _call(self.instance.reset, env_row, "reset", self.env.env_timeout_s), "reset's answer"
        )
        if not first:
            raise EnvironmentFailure("reset returned no messages: the model needs a prompt")
        tools_fn = getattr(self.instance, "tools", None)
        tools = tools_fn() if callable(tools_fn) else []
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
            raise EnvironmentFailure(
                f"tools() must return a list of function schemas, got {_describe(tools)}"
            )
        renderer = _renderer(self.env, [dict(t) for t in tools])
        images = self.env.trajectory_images(row)
        trajectory = start_trajectory(renderer, first, images)
        eot_ids = frozenset(renderer.encode(renderer.end_of_turn))
        episode = Episode(
            trajectory,
            renderer,
            eot_ids,
            self.env.parser,
            {},
            self.env.limits,
            {},
            None,
            "",
            rerender=self.env.rerender,
        )
        episode.images = images
        self.tools = bool(tools)
        return trajectory, episode

    async def run(self, generate: Generate, trajectory: Trajectory, episode: Episode) -> None:
        """Model turns, each answered by `step`, until the environment or a limit ends the episode."""
        while True:
            turns_before = trajectory.assistant_turns
            text = await episode.model_turn(generate)
            if trajectory.assistant_turns == turns_before:
                return  # no new model turn (no budget left, aborted before a token)
            cut = text is None
            if cut and trajectory.finish_reason is AgentFinishReason.ABORT:
                return  # aborted mid-turn (a deadline): nothing for the environment to judge
            turn_index = trajectory.assistant_turns - 1
            self.stage = f"step of turn {turn_index}"
            limits = self.env.limits
            final = (
                cut
                or trajectory.assistant_turns >= limits.max_assistant_turns
                or len(trajectory.response_ids) >= limits.max_response_tokens
            )
            result = await self.step(trajectory, episode, text, turn_index, final)
            if result.done:
                episode.end(AgentFinishReason.ENV_DONE)
                return
            if cut:
                return
            if trajectory.assistant_turns >= self.env.limits.max_assistant_turns:
                episode.end(AgentFinishReason.MAX_TURNS)
                return
            assert text is not None
            self.add_messages(episode, [dict(m) for m in result.messages], text.ended)
            if trajectory.finish_reason:
                return

    async def step(
        self, trajectory: Trajectory, episode: Episode, text: TurnText | None, turn: int, final: bool
    ) -> StepResult:
        """One `step` call on the latest model turn, its reward and info booked."""
        message = trajectory.messages[-1]
        words = str(message["content"])
        parsed = self.env.parser.parse(words) if self.tools else ParsedTurn(words)
        heads = episode.name_calls(parsed) if parsed.calls else []
        calls = tuple(
            ToolCall(head["tool_call_id"], call.name, dict(call.arguments))
            for head, call in zip(heads[len(parsed.errors) :], parsed.calls, strict=True)
        )
        model_turn = ModelTurn(
            text=words,
            turn=turn,
            messages=tuple(dict(m) for m in trajectory.messages),
            tool_calls=calls,
            tool_call_errors=tuple(parsed.errors),
            cut=text is None,
            final=final,
        )
        result = _check_step(
            await _call(self.instance.step, model_turn, "step", self.env.env_timeout_s), "step"
        )
        self.counts["env/steps"] += 1
        self.book(trajectory, result)
        return result

    def book(self, trajectory: Trajectory, result: StepResult) -> None:
        """`result`'s reward on the latest model turn and in the episode's total; its info as counters."""
        self.done = self.done or result.done
        if result.reward is not None:
            trajectory.reward_last_turn(float(result.reward))
            self.reward_total = (self.reward_total or 0.0) + float(result.reward)
        for key, value in result.info.items():
            self.counts[f"env/{key}"] = float(value)

    async def end(self, trajectory: Trajectory) -> None:
        """The environment's `end(finish_reason)` (`Environment.end`) for an episode a limit ended, if it
        has one: `ModelTurn.final` cannot foresee an episode whose environment's own messages use up the
        response budget, so no model turn follows. Its reward goes on the last model turn; an error or a
        bad answer fails the row as a step's would."""
        ender = getattr(self.instance, "end", None)
        reason = trajectory.finish_reason
        if self.done or not callable(ender) or not trajectory.assistant_turns:
            return
        if reason in (AgentFinishReason.ABORT, AgentFinishReason.ENV_ERROR):
            return
        self.stage = f"end ({reason or 'no budget left'})"
        result = await _call(
            ender, str(reason or AgentFinishReason.MAX_TOKENS), "end", self.env.env_timeout_s
        )
        self.book(trajectory, _check_step(result, "end"))

    def add_messages(self, episode: Episode, messages: list[dict[str, Any]], ended: bool) -> None:
        """The environment's messages after the model turn, each run of one role rendered as one turn."""
        k = 0
        while k < len(messages):
            role = messages[k]["role"]
            run = [messages[k]]
            while k + len(run) < len(messages) and messages[k + len(run)]["role"] == role:
                run.append(messages[k + len(run)])
            heads = [{key: v for key, v in m.items() if key not in ("role", "content")} for m in run]
            episode.add_env_turn(role, [m["content"] for m in run], ended if k == 0 else True, heads=heads)
            k += len(run)

    async def close(self) -> None:
        """The environment's `close`, if it has one; a failure is counted, never raised."""
        closer = getattr(self.instance, "close", None)
        if self.instance is None or not callable(closer):
            return
        try:
            async with asyncio.timeout(self.env.env_timeout_s):
                result = closer() if inspect.iscoroutinefunction(closer) else await _in_thread(closer)
                if inspect.isawaitable(result):
                    await result
        except Exception as err:  # noqa: BLE001 (user code; counted, logged, and the episode stands)
            self.counts["env/close_errors"] = 1.0
            log.warning("%s: close failed: %s: %s", self.where(), type(err).__name__, err)


def check_environment_config(mt: MultiTurnConfig) -> None:
    """On the driver before any worker starts: a ConfigError on `rollout.multi_turn.environment` unless
    it names a registered environment (the close name, and every one)."""
    if mt.environment:
        try:
            check_environment(mt.environment, "rollout.multi_turn.environment")
        except UnknownEnvironmentError as err:
            raise ConfigError("rollout.multi_turn.environment", str(err)) from None


def _fail(trajectory: Trajectory, episode: _EnvEpisode, err: EnvironmentFailure) -> None:
    """End `trajectory` as a bad row: masked out of the loss, its error named and counted."""
    trajectory.finish_reason = AgentFinishReason.ENV_ERROR
    trajectory.error = f"{episode.where()}: {err}"
    trajectory.response_mask = [0] * len(trajectory.response_mask)
    trajectory.reward = None
    episode.counts["env/errors"] = 1.0
    episode.counts["env/timeouts"] = float(err.timeout)
    log.warning("bad environment row: %s", trajectory.error)


@register_agent_loop(ENVIRONMENT_LOOP)
async def environment_loop(row: AgentRow, generate: Generate, env: AgentEnv) -> Trajectory:
    """One episode of the row's environment (module docstring)."""
    episode = _EnvEpisode(row, env)
    trajectory: Trajectory | None = None
    shared: Episode | None = None
    try:
        trajectory, shared = await episode.start()
        await episode.run(generate, trajectory, shared)
        await episode.end(trajectory)
        trajectory.reward = episode.reward_total
        episode.counts["env/unrewarded"] = float(episode.reward_total is None)
    except EnvironmentFailure as err:
        if trajectory is None:  # nothing was rendered yet: the row's own prompt, no response
            trajectory = start_trajectory(env.plain_renderer, row.messages, env.trajectory_images(row))
        _fail(trajectory, episode, err)
    finally:
        await episode.close()
    trajectory.truncate(env.limits.max_response_tokens)
    loop_counts = shared.metrics() if shared is not None else {"agent/assistant_turns": 0.0}
    trajectory.metrics = {**loop_counts, **episode.counts}
    return trajectory
