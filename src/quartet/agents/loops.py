"""The built-in agent loops, chosen per row by name: one dataset row -> one trajectory.

    single_turn  one generation from the rendered prompt (no tools in the prompt)
    tool_agent   the tool loop (`quartet.agents.tool_loop`): generate, run tool calls, repeat
    user_sim     the tool loop with a simulated user (an `Interaction`) answering turns without a tool call

A loop is an async function `(row, generate, env) -> Trajectory`. `AgentEnv` holds what the loops of one
rollout replica share (renderers, the tool-call parser, tool and interaction objects, limits); `AgentRow`
is what a dataset row gives one trajectory (messages, per-row tool and interaction arguments). Rows choose
their loop with an `agent_name` column, `rollout.multi_turn.default_agent` otherwise.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quartet.agents.images import ImageKit, TrajectoryImages
from quartet.agents.tool_loop import Generate, LoopLimits, UserSim, run_tool_loop, start_trajectory
from quartet.agents.tools.base import Tool
from quartet.agents.tools.parsing import ToolCallParser
from quartet.agents.trajectory import AgentFinishReason, ChatRenderer, Trajectory
from quartet.config.rollout import TemplateMode
from quartet.rollout.types import FinishReason

if TYPE_CHECKING:
    from quartet.agents.interaction import Interaction

__all__ = ["AGENT_LOOPS", "AgentEnv", "AgentLoop", "AgentRow", "UnknownAgentError", "run_agent"]


class UnknownAgentError(ValueError):
    """A row names an agent loop, tool set or interaction that the run does not have."""


@dataclass(frozen=True)
class AgentRow:
    """What one dataset row gives its trajectories."""

    messages: list[dict[str, Any]]
    """The prompt as chat messages (the row's `prompt` column)."""
    agent_name: str
    tools_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Per tool name: `{"create_kwargs": {...}}` for the tool's `create` (verl's layout)."""
    interaction_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """`{"name": <interaction>, ...}`: which simulated user, and its `start` arguments."""
    images: tuple[bytes, ...] = ()
    """The row's encoded images (its `images` column), one per `<image>` of `messages`."""


@dataclass
class AgentEnv:
    """What the loops of one replica share."""

    renderer: ChatRenderer
    """Renders with the tools' schemas in the prompt."""
    plain_renderer: ChatRenderer
    """Renders without tools (single_turn rows)."""
    parser: ToolCallParser
    tools: dict[str, Tool]
    interactions: dict[str, Interaction]
    limits: LoopLimits
    template_mode: TemplateMode = TemplateMode.KEEP_HISTORY_TOKENS
    """How prompts after the first are built (`rollout.multi_turn.template_mode`)."""
    images: ImageKit | None = None
    """A vision-language model's image processor and token; None for a text model."""

    def trajectory_images(self, row: AgentRow) -> TrajectoryImages | None:
        """A new trajectory's images, holding the row's; None for a text model (which refuses a row
        with images: its loops would drop them)."""
        if self.images is None:
            if row.images:
                raise ValueError(
                    f"the row holds {len(row.images)} images but the model reads none: train a "
                    "vision-language model (model.path holding one, or model.tiny.arch: qwen2_vl)"
                )
            return None
        images = TrajectoryImages(self.images)
        images.add(row.images)
        return images

    @property
    def rerender(self) -> bool:
        return self.template_mode is TemplateMode.RERENDER


AgentLoop = Callable[[AgentRow, Generate, AgentEnv], Awaitable[Trajectory]]


async def single_turn_loop(row: AgentRow, generate: Generate, env: AgentEnv) -> Trajectory:
    """One generation: the single-turn rollout as a trajectory."""
    renderer = env.plain_renderer
    images = env.trajectory_images(row)
    trajectory = start_trajectory(renderer, row.messages, images)
    if images is None:
        out = await generate(trajectory.prompt_ids, env.limits.max_response_tokens)
    else:
        request = images.request(trajectory.prompt_ids, [], [])
        out = await generate(trajectory.prompt_ids, env.limits.max_response_tokens, multi_modal=request)
    ids = list(out.token_ids)
    trajectory.add_model_turn(ids, list(out.logprobs) if out.logprobs is not None else None, out.versions)
    eot = renderer.encode(renderer.end_of_turn)
    ended = ids[-len(eot) :] == eot if eot else False
    text = renderer.tokenizer.decode(ids[: -len(eot)] if ended else ids, skip_special_tokens=False)
    trajectory.messages.append({"role": "assistant", "content": text})
    reasons = {FinishReason.ABORT: AgentFinishReason.ABORT, FinishReason.LENGTH: AgentFinishReason.MAX_TOKENS}
    trajectory.finish_reason = reasons.get(out.finish_reason, AgentFinishReason.NO_TOOL_CALL)
    trajectory.metrics = {"agent/assistant_turns": 1.0}
    return trajectory


async def tool_agent_loop(row: AgentRow, generate: Generate, env: AgentEnv) -> Trajectory:
    """The tool loop over the run's tools."""
    return await run_tool_loop(
        row.messages,
        generate,
        env.renderer,
        env.parser,
        env.tools,
        env.limits,
        row.tools_kwargs,
        rerender=env.rerender,
        images=env.trajectory_images(row),
    )


async def user_sim_loop(row: AgentRow, generate: Generate, env: AgentEnv) -> Trajectory:
    """The tool loop with the row's simulated user (`interaction_kwargs["name"]`)."""
    kwargs = dict(row.interaction_kwargs)
    name = kwargs.pop("name", None)
    if name is None and len(env.interactions) == 1:
        name = next(iter(env.interactions))
    if name not in env.interactions:
        have = ", ".join(sorted(env.interactions)) or "none"
        raise UnknownAgentError(
            f"the row asks for the interaction {name!r} (extra_info.interaction_kwargs.name); this run has: "
            f"{have}. Fix: add it to rollout.multi_turn.interactions or interaction_config_path"
        )
    user = UserSim(env.interactions[str(name)], kwargs)
    return await run_tool_loop(
        row.messages,
        generate,
        env.renderer,
        env.parser,
        env.tools,
        env.limits,
        row.tools_kwargs,
        user,
        rerender=env.rerender,
        images=env.trajectory_images(row),
    )


AGENT_LOOPS: dict[str, AgentLoop] = {
    "single_turn": single_turn_loop,
    "tool_agent": tool_agent_loop,
    "user_sim": user_sim_loop,
}


async def run_agent(row: AgentRow, generate: Generate, env: AgentEnv) -> Trajectory:
    """The trajectory of `row` by its loop; `UnknownAgentError` naming the loops when it has none."""
    loop = AGENT_LOOPS.get(row.agent_name)
    if loop is None:
        raise UnknownAgentError(
            f"unknown agent_name {row.agent_name!r} in a data row; the built-in loops are "
            f"{', '.join(AGENT_LOOPS)}. Fix: correct the row's agent_name column, or leave it empty to use "
            "rollout.multi_turn.default_agent"
        )
    return await loop(row, generate, env)
