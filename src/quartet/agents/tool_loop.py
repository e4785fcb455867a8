"""The tool loop: generate -> parse tool calls -> run the tools (concurrently) -> append results -> generate.

    trajectory = await run_tool_loop(messages, generate, renderer, parser, tools, limits)
    trajectory = await run_tool_loop(..., user=UserSim(interaction, kwargs))     # a simulated user too

`generate(prompt_ids, max_new_tokens)` is any awaitable token-in/token-out call (the rollout engine's
`generate_one`, or an OpenAI-compatible server's token endpoint) returning one `GenerationOutput`. The loop
stops when the model writes no tool call, after `max_assistant_turns` model turns, when the response would
pass `max_response_tokens`, or when a turn is cut by the token limit. A malformed call (bad JSON, unknown
tool, arguments off the schema) is answered to the model as a tool error message and counted; it never ends
the trajectory by itself. Tool results are cut to `max_tool_response_chars`.

Each tool message carries its call's `name` and `tool_call_id` (templates such as Hermes' refuse a tool
message without `name`; OpenAI's format pairs results with calls by id). The model writes its calls as
text without ids, so the loop gives them `call_<turn>_<index>` (from 0, the same for the same trajectory)
and keeps them on the model turn's message as OpenAI `tool_calls`; the template still renders that turn
as the model wrote it (`Trajectory.template_messages`).

With a simulated user (`UserSim`, the user_sim loop), a model turn without a tool call goes to the
interaction instead of ending the trajectory: its reply becomes the next user turn (mask 0), until it says
the conversation is done, or after `max_user_turns` replies. Its last score becomes the trajectory's reward;
without one, the tools' `calc_reward` sum does (when non-zero).

What the engine sees from turn 2 on follows the template mode (`rollout.multi_turn.template_mode`): with
keep_history_tokens (and strict) it is the trajectory's own ids, the engine's tokens plus the environment's
messages rendered once as a delta (`ChatRenderer.env_turn_ids`); with `rerender=True` it is the chat
template's rendering of the whole conversation, and model tokens the template changed leave the loss
(`Trajectory.rebase`, counted in `agent/template_rerender_breaks`).

With a vision-language model (`images`, `quartet.agents.images`) the prompt's `<image>` placeholders become
image parts, a tool result's `images` are shown as image parts of its tool message, each image token is
expanded once per merged patch, and every generation call gets the trajectory's images so far and their
slots (`multi_modal=`); the trajectory keeps them in order (`Trajectory.images`).

Model turns are decoded with special tokens kept (tool-call tags may be special tokens) and without the
end-of-turn token, which is how the chat template renders an assistant message: the conversation's
`messages` then re-render to the same ids (the drift check, `quartet.agents.trajectory.token_drift`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from quartet.agents.images import (
    Prepared,
    TrajectoryImages,
    image_parts,
    prompt_image_messages,
    safe_text,
)
from quartet.agents.tools.base import Tool, ToolResult
from quartet.agents.tools.executor import run_tool_calls
from quartet.agents.tools.parsing import ParsedTurn, ToolCallParser
from quartet.agents.trajectory import AgentFinishReason, ChatRenderer, Trajectory
from quartet.rollout.types import FinishReason, GenerationOutput

if TYPE_CHECKING:
    from quartet.agents.interaction import Interaction

__all__ = [
    "MALFORMED_CALL",
    "RERENDER_BREAKS",
    "Episode",
    "LoopLimits",
    "TurnText",
    "UserSim",
    "run_tool_loop",
    "start_trajectory",
]

RERENDER_BREAKS = "agent/template_rerender_breaks"
"""Per trajectory (rerender mode): environment turns whose rendering of the conversation changed tokens
the trajectory already held (a template that drops reasoning, re-spells tool calls, ...)."""


MALFORMED_CALL = "malformed_tool_call"
"""The `name` of a tool message answering a call the parser could not read (bad JSON, no name): a
template that requires a name gets one; no tool by that name is called."""


class Generate(Protocol):
    """One generation: `generate(prompt_ids, max_new_tokens)`, plus `multi_modal=` (the images so far and
    their slots, `TrajectoryImages.request`) only when the trajectory holds images."""

    def __call__(
        self, prompt_ids: list[int], max_new_tokens: int, /, multi_modal: dict[str, Any] | None = None
    ) -> Awaitable[GenerationOutput]: ...


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
    rerender: bool = False,
    images: TrajectoryImages | None = None,
) -> Trajectory:
    """One trajectory of the tool loop from a dataset row's `messages` (see the module docstring);
    `rerender`: the template mode of that name (`quartet.config.rollout.TemplateMode`); `images`: a
    vision-language model's, holding the prompt's (their `<image>` placeholders in `messages`)."""
    if images is not None and rerender:
        raise ValueError(
            "rollout.multi_turn.template_mode: rerender does not carry images (a re-rendered history would "
            "re-expand them); use keep_history_tokens or strict"
        )
    eot_ids = frozenset(renderer.encode(renderer.end_of_turn))
    trajectory = start_trajectory(renderer, messages, images)
    instances = await _create_tools(tools, tools_kwargs, images)
    user_id = await user.interaction.start(**dict(user.kwargs)) if user is not None else ""
    episode = Episode(
        trajectory, renderer, eot_ids, parser, tools, limits, instances, user, user_id, rerender=rerender
    )
    episode.images = images
    try:
        await episode.run(generate)
        rewards = [await tools[name].calc_reward(instances[name]) for name in tools]
        if episode.user_score is not None:
            trajectory.reward = float(episode.user_score)
        elif any(r != 0.0 for r in rewards):
            trajectory.reward = float(sum(rewards))
    finally:
        for name, tool in tools.items():
            await tool.release(instances[name])
        if user is not None:
            await user.interaction.finish(user_id)
    trajectory.truncate(limits.max_response_tokens)
    trajectory.metrics = episode.metrics()
    return trajectory


def start_trajectory(
    renderer: ChatRenderer, messages: list[dict[str, Any]], images: TrajectoryImages | None = None
) -> Trajectory:
    """The trajectory of a prompt: its rendering, each image's token expanded once per merged patch."""
    if images is None:
        return Trajectory(renderer.prompt_ids(messages), [dict(m) for m in messages])
    shown = prompt_image_messages([dict(m) for m in messages], len(images.blobs))
    trajectory = Trajectory(images.kit.expand(renderer.prompt_ids(shown), images.counts), shown)
    trajectory.images = images
    return trajectory


async def _create_tools(
    tools: Mapping[str, Tool], tools_kwargs: Mapping[str, Any] | None, images: TrajectoryImages | None
) -> dict[str, str]:
    """One instance per tool, with the row's `create_kwargs`, and the prompt's images for a tool that
    `wants_images`."""
    kwargs = dict(tools_kwargs or {})
    instances = {}
    for name, tool in tools.items():
        create = dict(kwargs.get(name, {}).get("create_kwargs", {}))
        if tool.wants_images:
            create["images"] = list(images.blobs) if images is not None else []
        instances[name] = await tool.create(**create)
    return instances


@dataclass(frozen=True)
class TurnText:
    """A model turn the loop goes on from: its decoded text, and whether it ended at the end-of-turn id."""

    text: str
    ended: bool


@dataclass
class Episode:
    """One trajectory's loop: what it carries from turn to turn, one method per kind of turn. The generic
    environment loop (`quartet.environments.loop`) drives one too, without tools or a user: its
    `model_turn`, `name_calls` and `add_env_turn` are the token bookkeeping every loop shares."""

    trajectory: Trajectory
    renderer: ChatRenderer
    eot_ids: frozenset[int]
    parser: ToolCallParser
    tools: Mapping[str, Tool]
    limits: LoopLimits
    instances: dict[str, str]
    user: UserSim | None
    user_id: str
    counts: dict[str, float] = field(
        default_factory=lambda: {
            "tool/calls": 0.0,
            "tool/failed": 0.0,
            "tool/parse_errors": 0.0,
            "agent/bad_turn_rewards": 0.0,
        }
    )
    latencies: list[float] = field(default_factory=list)
    user_turns: int = 0
    user_score: float | None = None
    rerender: bool = False
    """The `rerender` template mode: each prompt is the template's rendering of the messages."""
    images: TrajectoryImages | None = None
    """The trajectory's images (a vision-language model), prompt's first."""

    def __post_init__(self) -> None:
        if self.rerender:
            self.counts[RERENDER_BREAKS] = 0.0

    def end(self, reason: AgentFinishReason) -> None:
        self.trajectory.finish_reason = reason

    async def run(self, generate: Generate) -> None:
        """Model turns, each answered by the tools or the simulated user, until one of them ends it."""
        while (turn := await self.model_turn(generate)) is not None:
            parsed = self.parser.parse(turn.text) if self.tools else None
            if parsed is None or (not parsed.calls and not parsed.errors):
                if self.user is None:
                    self.end(AgentFinishReason.NO_TOOL_CALL)
                    return
                if not await self.user_turn(self.user, turn.ended):
                    return
                continue
            if self.trajectory.assistant_turns >= self.limits.max_assistant_turns:
                self.end(AgentFinishReason.MAX_TURNS)
                return
            await self.tool_turn(parsed, turn.ended)
            if self.trajectory.finish_reason:  # the tool turn ended it (an image turn past the budget)
                return

    async def model_turn(self, generate: Generate) -> TurnText | None:
        """Generate within the response's token budget and append the turn; None when the turn ends the
        trajectory (no budget left, aborted, cut by a length limit)."""
        t = self.trajectory
        budget = self.limits.max_response_tokens - len(t.response_ids)
        if budget <= 0:
            self.end(AgentFinishReason.MAX_TOKENS)
            return None
        ids_so_far = t.prompt_ids + t.response_ids
        if self.images is None:
            out = await generate(ids_so_far, budget)
        else:
            request = self.images.request(t.prompt_ids, t.response_ids, t.response_mask)
            out = await generate(ids_so_far, budget, multi_modal=request)
        ids = list(out.token_ids)
        if out.finish_reason is FinishReason.ABORT and not ids:  # cut before it wrote anything
            self.end(AgentFinishReason.ABORT)
            return None
        logprobs = list(out.logprobs) if out.logprobs is not None else None
        t.add_model_turn(ids, logprobs, out.versions, out.routed_experts)
        ended = bool(ids) and ids[-1] in self.eot_ids
        text = self.renderer.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
        t.messages.append({"role": "assistant", "content": text})
        if out.finish_reason is FinishReason.ABORT:
            self.end(AgentFinishReason.ABORT)
            return None
        if out.finish_reason is FinishReason.LENGTH:
            self.end(AgentFinishReason.MAX_TOKENS if len(ids) >= budget else AgentFinishReason.LENGTH)
            return None
        return TurnText(text, ended)

    async def user_turn(self, user: UserSim, ended: bool) -> bool:
        """The interaction loop's step: the simulated user answers the turn; False when that ends it."""
        reply = await user.interaction.respond(self.user_id, self.trajectory.messages)
        self.user_score = reply.score if reply.score is not None else self.user_score
        if reply.turn_reward is not None:
            self.counts["agent/bad_turn_rewards"] += _reward_turn(self.trajectory, [reply.turn_reward])
        for key, value in reply.metrics.items():
            self.counts[key] = value  # the interaction's running figures: the last one stands
        if reply.done:
            self.end(AgentFinishReason.INTERACTION_DONE)
            return False
        if self.user_turns >= self.limits.max_user_turns:
            self.end(AgentFinishReason.MAX_USER_TURNS)
            return False
        if self.trajectory.assistant_turns >= self.limits.max_assistant_turns:
            self.end(AgentFinishReason.MAX_TURNS)
            return False
        self.user_turns += 1
        self.add_env_turn("user", [self.text(reply.content)], ended)
        return True

    async def tool_turn(self, parsed: ParsedTurn, ended: bool) -> None:
        """Run the turn's calls concurrently; their results (and the malformed calls' errors) answer it,
        each tool message carrying its call's `name` and `tool_call_id` (`name_calls`)."""
        heads = self.name_calls(parsed)
        replies: list[Any] = [self.text(f"Error: {problem}") for problem in parsed.errors]
        shown: list[tuple[bytes, Prepared]] = []
        self.counts["tool/parse_errors"] += len(parsed.errors)
        if parsed.calls:
            timeout_s, max_chars = self.limits.tool_timeout_s, self.limits.max_tool_response_chars
            results, metrics = await run_tool_calls(
                parsed.calls, self.tools, self.instances, timeout_s, max_chars
            )
            for result in results:
                content, images = self.tool_content(result)
                replies.append(content)
                shown += images
            rewards = [r.reward for r in results if r.reward is not None]
            self.counts["agent/bad_turn_rewards"] += _reward_turn(self.trajectory, rewards)
            for key, value in metrics.items():
                if "latency" not in key:  # counters add up over turns
                    self.counts[key] = self.counts.get(key, 0.0) + value
            self.latencies.append(metrics.get("tool/latency_s/max", 0.0))
        self.add_env_turn("tool", replies, ended, shown, heads)

    def name_calls(self, parsed: ParsedTurn) -> list[dict[str, str]]:
        """Ids for the latest model turn's calls, `call_<turn>_<index>` (turn and index from 0: the same
        ids for the same trajectory), put on its message as OpenAI `tool_calls`; and the `name` and
        `tool_call_id` of each tool message answering the turn, malformed calls' errors first (those are
        named `MALFORMED_CALL`, ids `call_<turn>_bad<k>`). Templates such as Hermes' refuse a tool message
        without `name`; OpenAI's format pairs calls and results by id."""
        turn = self.trajectory.assistant_turns - 1
        heads = [
            {"name": MALFORMED_CALL, "tool_call_id": f"call_{turn}_bad{k}"} for k in range(len(parsed.errors))
        ]
        if not parsed.calls:
            return heads
        ids = [f"call_{turn}_{i}" for i in range(len(parsed.calls))]
        message = self.trajectory.messages[-1]
        assert message["role"] == "assistant", "a tool turn answers the model turn just appended"
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for i, c in zip(ids, parsed.calls, strict=True)
        ]
        self.trajectory.calls_in_text.append(len(self.trajectory.messages) - 1)
        return heads + [{"name": c.name, "tool_call_id": i} for i, c in zip(ids, parsed.calls, strict=True)]

    def text(self, text: str) -> str:
        """Environment text as the turn shows it: with images in play, no image slot smuggled in."""
        return safe_text(text) if self.images is not None else text

    def tool_content(self, result: ToolResult) -> tuple[Any, list[tuple[bytes, Prepared]]]:
        """A tool message's content and the images it shows: text and one image part per image that
        decodes (a vision-language model); an unreadable image makes the call an error, and a text
        model's loop drops the images, saying so in the text."""
        blobs = [bytes(b) for b in result.images]
        if not blobs:
            return self.text(result.text), []
        if self.images is None:
            self.counts["tool/images_dropped"] = self.counts.get("tool/images_dropped", 0.0) + len(blobs)
            return f"{result.text} [{len(blobs)} image(s) not shown: the model reads no images]", []
        try:
            prepared = self.images.prepare(blobs)
        except ValueError as err:
            self.counts["tool/bad_images"] = self.counts.get("tool/bad_images", 0.0) + 1
            return self.text(f"Error: the tool returned an image that cannot be read: {err}"), []
        return image_parts(self.text(result.text), len(blobs)), list(zip(blobs, prepared, strict=True))

    def add_env_turn(
        self,
        role: str,
        contents: list[Any],
        ended: bool,
        shown: list[tuple[bytes, Prepared]] | None = None,
        heads: list[dict[str, str]] | None = None,
    ) -> None:
        """Messages from the environment (`role`: "tool" or "user"), appended: rendered once as a delta
        after the engine's tokens, or (`rerender`) as the template's rendering of the whole conversation,
        counting a turn whose rendering changed tokens already there (`Trajectory.rebase`). `shown`: the
        images the contents' image parts show, in order, processed (`add_image_turn`); `heads`: per
        content, the keys its message carries besides role and content (a tool message's `name` and
        `tool_call_id`)."""
        keys = heads or [{} for _ in contents]
        env_messages: list[dict[str, Any]] = [
            {"role": role, **head, "content": c} for head, c in zip(keys, contents, strict=True)
        ]
        t = self.trajectory
        if shown and self.images is not None:
            self.add_image_turn(role, env_messages, ended, shown)
            return
        if self.rerender:
            before = len(t.prompt_ids) + len(t.response_ids)
            if t.rebase(self.renderer.prompt_ids(t.template_messages() + env_messages), role) < before:
                self.counts[RERENDER_BREAKS] += 1
        else:
            t.add_env_turn(role, self.renderer.env_turn_ids(env_messages, ended_with_eot=ended))
        t.messages += env_messages

    def add_image_turn(
        self, role: str, env_messages: list[dict[str, Any]], ended: bool, shown: list[tuple[bytes, Prepared]]
    ) -> None:
        """An environment turn that shows images: its rendering with each image token expanded, appended
        with the images. A turn that would leave the model no room to answer ends the trajectory
        (max_tokens) instead: cutting it later could split an image's tokens from its pixels."""
        assert self.images is not None
        t = self.trajectory
        ids = self.renderer.env_turn_ids(env_messages, ended_with_eot=ended)
        ids = self.images.kit.expand(ids, [n for _, (_, n) in shown])
        if len(t.response_ids) + len(ids) >= self.limits.max_response_tokens:
            self.end(AgentFinishReason.MAX_TOKENS)
            return
        self.images.add([b for b, _ in shown], [p for _, p in shown])
        t.add_env_turn(role, ids)
        t.messages += env_messages

    def metrics(self) -> dict[str, float]:
        """The loop's counters, turns and slowest tool call."""
        return {
            **self.counts,
            "agent/assistant_turns": float(self.trajectory.assistant_turns),
            "agent/user_turns": float(self.user_turns),
            "tool/latency_s/max": max(self.latencies, default=0.0),
        }
