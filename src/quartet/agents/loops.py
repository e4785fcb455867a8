"""The agent loops, chosen per row by name: one dataset row -> one trajectory. Built in:

    single_turn  one generation from the rendered prompt (no tools in the prompt)
    tool_agent   the tool loop (`quartet.agents.tool_loop`): generate, run tool calls, repeat
    user_sim     the tool loop with a simulated user (an `Interaction`) answering turns without a tool call

A loop is an async function `(row, generate, env) -> Trajectory`. `AgentEnv` holds what the loops of one
rollout replica share (renderers, the tool-call parser, tool and interaction objects, limits); `AgentRow`
is what a dataset row gives one trajectory (messages, per-row tool and interaction arguments). Rows choose
their loop with an `agent_name` column, `rollout.multi_turn.default_agent` otherwise.

Every loop, built-in or a user's, is registered by name with `@register_agent_loop`, as estimators are
with `@register_estimator`: a user module named by `algorithm.custom_module` defines its loops under the
decorator, the driver imports it when the config loads and every rollout replica imports it before it
builds its runner (`quartet.roles.rollout.role`). The built-ins are registered when this module is
imported, which importing the decorator does, so a user loop can never take a built-in name. The config
cannot check a loop name (it sits below this package); `AgentRunner.from_config` does, on the driver
before any worker starts (`check_agent_loop`).
"""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from quartet.agents.images import ImageKit, TrajectoryImages
from quartet.agents.tool_loop import Generate, LoopLimits, UserSim, run_tool_loop, start_trajectory
from quartet.agents.tools.base import Tool
from quartet.agents.tools.parsing import ToolCallParser
from quartet.agents.trajectory import AgentFinishReason, ChatRenderer, Trajectory
from quartet.config.errors import ConfigError
from quartet.config.rollout import TemplateMode
from quartet.core.registry import check_unclaimed
from quartet.rollout.types import FinishReason

if TYPE_CHECKING:
    from quartet.agents.interaction import Interaction

__all__ = [
    "AgentEnv",
    "AgentLoop",
    "AgentRow",
    "UnknownAgentError",
    "check_agent_loop",
    "register_agent_loop",
    "registered_agent_loops",
    "run_agent",
    "single_turn_loop",
    "tool_agent_loop",
    "user_sim_loop",
]


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
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """`{"name": <environment>, ...}`: which environment runs the row (the `environment` loop), and the
    arguments its class is built with (the row's `extra_info.env_kwargs`)."""
    data_source: str = ""
    ground_truth: Any = None
    extra_info: Mapping[str, Any] = field(default_factory=dict)
    index: int | None = None
    """The row's index in its data set (the batch's `index` column), for error messages."""
    sample: int = 0
    """Which of the row's `rollout.n` trajectories this is (0, 1, ...)."""


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
    environment: str = ""
    """The environment of rows whose `env_kwargs` name none (`rollout.multi_turn.environment`)."""
    environment_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Arguments every environment instance is built with, under the row's (`environment_kwargs`)."""
    env_timeout_s: float = 30.0
    """Longest wait for one environment call (reset, step, close)."""
    renderers: dict[str, ChatRenderer] = field(default_factory=dict)
    """Renderers showing an environment's tools, by the tools' JSON (built once per replica)."""

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
"""A loop: (row, generate, env) -> the row's trajectory."""

L = TypeVar("L", bound=AgentLoop)

_LOOPS: dict[str, AgentLoop] = {}


def register_agent_loop(name: str) -> Callable[[L], L]:
    """Decorator: make `fn(row, generate, env) -> Trajectory` the agent loop `name` (a row's `agent_name`,
    or `rollout.multi_turn.default_agent`). A name is registered once: the built-ins' names are taken."""
    check_unclaimed(name, _LOOPS, "agent loop")

    def decorate(fn: L) -> L:
        _LOOPS[name] = fn
        return fn

    return decorate


def registered_agent_loops() -> Mapping[str, AgentLoop]:
    """Every loop of this process by name, the built-ins first (read-only view)."""
    return MappingProxyType(_LOOPS)


def _known_loops(name: str) -> str:
    close = difflib.get_close_matches(name, list(_LOOPS), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"{hint}known loops: {', '.join(_LOOPS)}"


def check_agent_loop(name: str) -> None:
    """A ConfigError on `rollout.multi_turn.default_agent` unless `name` is a registered loop, naming the
    closest one and every one, and how to add one."""
    if name not in _LOOPS:
        raise ConfigError(
            "rollout.multi_turn.default_agent",
            f"unknown agent loop {name!r}",
            f"{_known_loops(name)}; or register it with @register_agent_loop in the module named by "
            "algorithm.custom_module",
        )


@register_agent_loop("single_turn")
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
    logprobs = list(out.logprobs) if out.logprobs is not None else None
    trajectory.add_model_turn(ids, logprobs, out.versions, out.routed_experts)
    eot = renderer.encode(renderer.end_of_turn)
    ended = ids[-len(eot) :] == eot if eot else False
    text = renderer.tokenizer.decode(ids[: -len(eot)] if ended else ids, skip_special_tokens=False)
    trajectory.messages.append({"role": "assistant", "content": text})
    reasons = {FinishReason.ABORT: AgentFinishReason.ABORT, FinishReason.LENGTH: AgentFinishReason.MAX_TOKENS}
    trajectory.finish_reason = reasons.get(out.finish_reason, AgentFinishReason.NO_TOOL_CALL)
    trajectory.metrics = {"agent/assistant_turns": 1.0}
    return trajectory


@register_agent_loop("tool_agent")
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


@register_agent_loop("user_sim")
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


async def run_agent(row: AgentRow, generate: Generate, env: AgentEnv) -> Trajectory:
    """The trajectory of `row` by its loop; `UnknownAgentError` naming the loops when it has none."""
    loop = _LOOPS.get(row.agent_name)
    if loop is None:
        raise UnknownAgentError(
            f"unknown agent_name {row.agent_name!r} in a data row; {_known_loops(row.agent_name)}. Fix: "
            "correct the row's agent_name column, leave it empty to use rollout.multi_turn.default_agent, "
            "or register the loop with @register_agent_loop in the module named by algorithm.custom_module"
        )
    return await loop(row, generate, env)
