"""The tool loop: generate -> parse tool calls -> run the tools (concurrently) -> append results -> generate.

    trajectory = await run_tool_loop(messages, generate, renderer, parser, tools, limits)
    trajectory = await run_tool_loop(..., user=UserSim(interaction, kwargs))     # a simulated user too

`generate(prompt_ids, max_new_tokens)` is any awaitable token-in/token-out call (the rollout engine's
`generate_one`, or an OpenAI-compatible server's token endpoint) returning one `GenerationOutput`. The loop
stops when the model writes no tool call, after `max_assistant_turns` model turns, when the response would
pass `max_response_tokens`, or when a turn is cut by the token limit. A malformed call (bad JSON, unknown
tool, arguments off the schema) is answered to the model as a tool error message and counted; it never ends
the trajectory by itself. Tool results are cut to `max_tool_response_chars`.

With a simulated user (`UserSim`, the user_sim loop), a model turn without a tool call goes to the
interaction instead of ending the trajectory: its reply becomes the next user turn (mask 0), until it says
the conversation is done, or after `max_user_turns` replies. Its last score becomes the trajectory's reward;
without one, the tools' `calc_reward` sum does (when non-zero).

Model turns are decoded with special tokens kept (tool-call tags may be special tokens) and without the
end-of-turn token, which is how the chat template renders an assistant message: the conversation's
`messages` then re-render to the same ids (the drift check, `quartet.agents.trajectory.token_drift`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quartet.agents.tools.base import Tool
from quartet.agents.tools.executor import run_tool_calls
from quartet.agents.tools.parsing import ToolCallParser
from quartet.agents.trajectory import ChatRenderer, Trajectory
from quartet.rollout.types import FinishReason, GenerationOutput

if TYPE_CHECKING:
    from quartet.agents.interaction import Interaction

__all__ = ["LoopLimits", "UserSim", "run_tool_loop"]

Generate = Callable[[list[int], int], Awaitable[GenerationOutput]]


@dataclass(frozen=True)
class LoopLimits:
    """When a trajectory ends, and how much a tool may say."""

    max_assistant_turns: int = 4
    max_user_turns: int = 4
    """Simulated-user replies at most (with a `UserSim`)."""
    max_response_tokens: int = 256
    """Everything after the prompt: model and environment tokens."""
    max_tool_response_chars: int = 512
    tool_timeout_s: float = 10.0


@dataclass(frozen=True)
class UserSim:
    """The simulated user of one trajectory: the interaction and the row's `interaction_kwargs`."""

    interaction: Interaction
    kwargs: Mapping[str, Any]


def _reward_turn(trajectory: Trajectory, rewards: list[Any]) -> int:
    """Add the finite numbers of `rewards` to the latest model turn's reward; how many were not (a tool or
    a user that returned NaN, infinity or a non-number: counted in `agent/bad_turn_rewards`, never summed
    into an advantage)."""
    good = [float(r) for r in rewards if isinstance(r, int | float) and math.isfinite(r)]
    if good:
        trajectory.reward_last_turn(sum(good))
    return len(rewards) - len(good)


async def run_tool_loop(
    messages: list[dict[str, Any]],
    generate: Generate,
    renderer: ChatRenderer,
    parser: ToolCallParser,
    tools: Mapping[str, Tool],
    limits: LoopLimits,
    tools_kwargs: Mapping[str, Any] | None = None,
    user: UserSim | None = None,
) -> Trajectory:
    """One trajectory of the tool loop from a dataset row's `messages` (see the module docstring)."""
    tokenizer = renderer.tokenizer
    eot_ids = set(renderer.encode(renderer.end_of_turn))
    trajectory = Trajectory(renderer.prompt_ids(messages), [dict(m) for m in messages])
    kwargs = dict(tools_kwargs or {})
    instances = {
        name: await tool.create(**dict(kwargs.get(name, {}).get("create_kwargs", {})))
        for name, tool in tools.items()
    }
    counts = {"tool/calls": 0.0, "tool/failed": 0.0, "tool/parse_errors": 0.0, "agent/bad_turn_rewards": 0.0}
    latencies: list[float] = []
    user_id = await user.interaction.start(**dict(user.kwargs)) if user is not None else ""
    user_turns, user_score = 0, None
    try:
        while True:
            budget = limits.max_response_tokens - len(trajectory.response_ids)
            if budget <= 0:
                trajectory.finish_reason = "max_tokens"
                break
            out = await generate(trajectory.prompt_ids + trajectory.response_ids, budget)
            ids = list(out.token_ids)
            if out.finish_reason is FinishReason.ABORT and not ids:  # cut before it wrote anything
                trajectory.finish_reason = "abort"
                break
            trajectory.add_model_turn(
                ids, list(out.logprobs) if out.logprobs is not None else None, out.versions
            )
            ended = bool(ids) and ids[-1] in eot_ids
            text = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
            trajectory.messages.append({"role": "assistant", "content": text})
            if out.finish_reason is FinishReason.ABORT:
                trajectory.finish_reason = "abort"
                break
            if out.finish_reason is FinishReason.LENGTH:
                trajectory.finish_reason = "max_tokens" if len(ids) >= budget else "length"
                break
            parsed = parser.parse(text) if tools else None
            if parsed is None or (not parsed.calls and not parsed.errors):
                if user is None:
                    trajectory.finish_reason = "no_tool_call"
                    break
                reply = await user.interaction.respond(user_id, trajectory.messages)
                user_score = reply.score if reply.score is not None else user_score
                if reply.turn_reward is not None:
                    counts["agent/bad_turn_rewards"] += _reward_turn(trajectory, [reply.turn_reward])
                for key, value in reply.metrics.items():
                    counts[key] = value  # the interaction's running figures: the last one stands
                if reply.done:
                    trajectory.finish_reason = "interaction_done"
                    break
                if user_turns >= limits.max_user_turns:
                    trajectory.finish_reason = "max_user_turns"
                    break
                if trajectory.assistant_turns >= limits.max_assistant_turns:
                    trajectory.finish_reason = "max_turns"
                    break
                user_turns += 1
                user_messages = [{"role": "user", "content": reply.content}]
                trajectory.add_env_turn("user", renderer.env_turn_ids(user_messages, ended_with_eot=ended))
                trajectory.messages += user_messages
                continue
            if trajectory.assistant_turns >= limits.max_assistant_turns:
                trajectory.finish_reason = "max_turns"
                break
            replies: list[str] = [f"Error: {problem}" for problem in parsed.errors]
            counts["tool/parse_errors"] += len(parsed.errors)
            if parsed.calls:
                results, metrics = await run_tool_calls(
                    parsed.calls, tools, instances, limits.tool_timeout_s, limits.max_tool_response_chars
                )
                replies += [r.text for r in results]
                rewards = [r.reward for r in results if r.reward is not None]
                counts["agent/bad_turn_rewards"] += _reward_turn(trajectory, rewards)
                for key, value in metrics.items():
                    if "latency" not in key:  # counters add up over turns
                        counts[key] = counts.get(key, 0.0) + value
                latencies.append(metrics.get("tool/latency_s/max", 0.0))
            tool_messages = [{"role": "tool", "content": reply} for reply in replies]
            trajectory.add_env_turn("tool", renderer.env_turn_ids(tool_messages, ended_with_eot=ended))
            trajectory.messages += tool_messages
        rewards = [await tools[name].calc_reward(instances[name]) for name in tools]
        if user_score is not None:
            trajectory.reward = float(user_score)
        elif any(r != 0.0 for r in rewards):
            trajectory.reward = float(sum(rewards))
    finally:
        for name, tool in tools.items():
            await tool.release(instances[name])
        if user is not None:
            await user.interaction.finish(user_id)
    trajectory.truncate(limits.max_response_tokens)
    trajectory.metrics = {
        **counts,
        "agent/assistant_turns": float(trajectory.assistant_turns),
        "agent/user_turns": float(user_turns),
        "tool/latency_s/max": max(latencies, default=0.0),
    }
    return trajectory
