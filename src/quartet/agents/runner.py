"""The agent loops of one rollout replica over a batch of prompt rows: n trajectories per row, concurrently.

    runner = AgentRunner.from_config(cfg.rollout.multi_turn, tokenizer, max_response_tokens=R)
    batch = runner.run(prompts, sampling, generate_tokens, pad_token_id)   # the rollout Batch

Every trajectory is one asyncio task; their generation calls go to one token-in/token-out function
(`OpenAIServer.generate_tokens`), so the engine batches the turns of all trajectories together as they
arrive. Each trajectory samples with its own seed, derived from the request's seed, the row, the sample
and the turn, so `n` samples of a row differ and a run is reproducible.

The output is the rollout Batch of `quartet.agents.batch` with, per row:
- `extra_info` gains `final_message` (the last assistant turn, special tokens removed), `num_turns` and
  `env_reward` (the interaction's, the tools' or the environment's score, or None), for reward functions,
  and `env_error` where an environment failed the trajectory (`quartet.environments.loop`);
- `agent_metrics`: the trajectory's loop counters (tool calls, failures, turns, drift, latency);
- `finish_reason` says why the loop ended;
- with a vision-language model (`image_processor`), `images` and `multi_modal_inputs` hold each
  trajectory's images in order, the prompt's and those its tools returned (docs/vision.md).

With `rollout.multi_turn.step_deadline_s`, a generation still running (or asked for) when the deadline
passes is aborted in the engine and dropped: the trajectory keeps its finished turns, ends with
finish_reason `deadline` and carries `agent/deadline_cut` = 1 (the step reports the total).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from quartet.agents.batch import trajectories_to_batch
from quartet.agents.images import ImageKit
from quartet.agents.loops import AgentEnv, AgentRow, check_agent_loop, run_agent
from quartet.agents.template_check import TemplateVerdict
from quartet.agents.tool_loop import Generate, LoopLimits
from quartet.agents.tools.base import Tool
from quartet.agents.tools.parsing import get_parser
from quartet.agents.trajectory import AgentFinishReason, ChatRenderer, Trajectory, token_drift
from quartet.config.rollout import MultiTurnConfig
from quartet.core.batch import Batch
from quartet.rollout.types import FinishReason, GenerationOutput, SamplingParams

if TYPE_CHECKING:
    from quartet.agents.interaction import Interaction

__all__ = ["AgentRunner", "GenerateTokens", "build_interactions", "build_tools", "trajectory_seed"]


class GenerateTokens(Protocol):
    """The replica's token call (`OpenAIServer.generate_tokens`, a `RequestScheduler`, an
    `HttpReplicaClient`): `multi_modal=` is passed only for a trajectory that holds images."""

    def __call__(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        /,
        multi_modal: dict[str, Any] | None = None,
    ) -> Awaitable[list[GenerationOutput]]: ...


_MASK63 = (1 << 63) - 1


def build_tools(mt: MultiTurnConfig) -> dict[str, Tool]:
    """The run's tools: the built-in ones named in `tools`, then those of `tool_config_path`."""
    from quartet.agents.tools.calculator import CalculatorTool
    from quartet.agents.tools.python_runner import PythonTool
    from quartet.agents.tools.registry import load_tools
    from quartet.agents.tools.zoom import ZoomTool

    builtin: dict[str, Callable[[], Tool]] = {
        "calculator": CalculatorTool,
        "python": PythonTool,
        "zoom": ZoomTool,
    }
    tools: dict[str, Tool] = {}
    for name in mt.tools:
        tool = builtin[name]()
        tools[tool.name] = tool
    if mt.tool_config_path:
        for name, tool in load_tools(mt.tool_config_path).items():
            if name in tools:
                raise ValueError(
                    f"{mt.tool_config_path}: the tool {name!r} is also in rollout.multi_turn.tools; "
                    "keep one of the two"
                )
            tools[name] = tool
    return tools


def build_interactions(mt: MultiTurnConfig) -> dict[str, Interaction]:
    """The run's simulated users: the built-in ones named in `interactions`, then the YAML file's."""
    found: dict[str, Interaction] = {}
    if not mt.interactions and not mt.interaction_config_path:
        return found
    from quartet.agents.interaction_registry import load_interactions
    from quartet.agents.interactions.guessing import GuessingGameInteraction

    builtin: dict[str, Callable[[], Interaction]] = {"guessing_game": GuessingGameInteraction}
    for name in mt.interactions:
        interaction = builtin[name]()
        found[interaction.name] = interaction
    if mt.interaction_config_path:
        for name, interaction in load_interactions(mt.interaction_config_path).items():
            if name in found:
                raise ValueError(
                    f"{mt.interaction_config_path}: the interaction {name!r} is also in "
                    "rollout.multi_turn.interactions; keep one of the two"
                )
            found[name] = interaction
    return found


def _objects(values: list[Any]) -> np.ndarray:
    """A one-object-per-row column (lists and dicts kept whole, not turned into array dimensions)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _row_index(value: Any) -> int | None:
    """A row's dataset index from the batch's `index` column (None where the batch has none)."""
    return None if value is None else int(value)


def trajectory_seed(seed: int, row: int, sample: int, n: int, turn: int) -> int:
    """A distinct sampling seed per (request seed, row, sample, turn)."""
    return ((seed * 1_000_003 + row * n + sample) * 1_009 + turn) & _MASK63


class AgentRunner:
    """Agent loops of one replica (see the module docstring)."""

    def __init__(self, mt: MultiTurnConfig, env: AgentEnv) -> None:
        self.mt = mt
        self.env = env
        self.template_verdict: TemplateVerdict | None = None
        """The chat-template check on the first rows this runner was given (`preflight`)."""

    def preflight(self, rows: Sequence[list[dict[str, Any]]], model: str = "") -> TemplateVerdict:
        """Check the chat template on `rows` (the run's first conversations) with the run's tools, before
        any generation, and act on `template_mode` (`quartet.agents.template_policy`; strict raises)."""
        from quartet.agents.template_policy import preflight_template

        tools = [tool.schema for tool in self.env.tools.values()] or None
        tokenizer = self.env.renderer.tokenizer
        name = model or str(getattr(tokenizer, "name_or_path", "") or "the model")
        verdict = preflight_template(
            tokenizer, self.mt.template_mode, rows, tools, bool(self.env.interactions), name
        )
        self.template_verdict = verdict
        return verdict

    @classmethod
    def from_config(
        cls, mt: MultiTurnConfig, tokenizer: Any, max_response_tokens: int, image_processor: Any = None
    ) -> AgentRunner:
        """The runner of a replica; `image_processor`: a vision-language model's (its loops then carry the
        rows' images and those tools return, `quartet.agents.images`). A `default_agent` no loop is
        registered under is a ConfigError here, before any tool is built."""
        check_agent_loop(mt.default_agent)
        tools = build_tools(mt)
        schemas = [tool.schema for tool in tools.values()]
        env = AgentEnv(
            template_mode=mt.template_mode,
            renderer=ChatRenderer(tokenizer, schemas),
            plain_renderer=ChatRenderer(tokenizer),
            parser=get_parser(mt.tool_call_format),
            tools=tools,
            images=ImageKit.of(image_processor, tokenizer) if image_processor is not None else None,
            interactions=build_interactions(mt),
            limits=LoopLimits(
                max_assistant_turns=mt.max_assistant_turns,
                max_user_turns=mt.max_user_turns,
                max_response_tokens=max_response_tokens,
                max_tool_response_chars=mt.max_tool_response_length,
                tool_timeout_s=mt.tool_timeout_s,
            ),
            environment=mt.environment,
            environment_kwargs=dict(mt.environment_kwargs),
            env_timeout_s=mt.env_timeout_s,
        )
        return cls(mt, env)

    def rows(self, prompts: Batch) -> list[AgentRow]:
        """Each prompt row's messages, loop and tool/interaction arguments."""
        nt = prompts.non_tensors
        if "raw_prompt" not in nt:
            raise KeyError(
                "multi-turn rollouts need the prompts' chat messages (non-tensor column 'raw_prompt', "
                f"which PromptDataset.batch gives); the batch has {prompts.keys()}"
            )
        size = len(prompts)
        names = list(nt["agent_name"]) if "agent_name" in nt else [None] * size
        extras = list(nt["extra_info"]) if "extra_info" in nt else [None] * size
        images = list(nt["images"]) if "images" in nt else [None] * size
        sources = list(nt["data_source"]) if "data_source" in nt else [""] * size
        truths = list(nt["ground_truth"]) if "ground_truth" in nt else [None] * size
        indexes = list(nt["index"]) if "index" in nt else [None] * size
        out = []
        for i, (messages, name, extra, blobs) in enumerate(
            zip(nt["raw_prompt"], names, extras, images, strict=True)
        ):
            info: Mapping[str, Any] = extra if isinstance(extra, Mapping) else {}
            out.append(
                AgentRow(
                    messages=[dict(m) for m in messages],
                    agent_name=str(name) if name else self.mt.default_agent,
                    tools_kwargs=dict(info.get("tools_kwargs") or {}),
                    interaction_kwargs=dict(info.get("interaction_kwargs") or {}),
                    images=tuple(bytes(b) for b in blobs or ()),
                    env_kwargs=dict(info.get("env_kwargs") or {}),
                    data_source=str(sources[i] or ""),
                    ground_truth=truths[i],
                    extra_info=dict(info),
                    index=_row_index(indexes[i]),
                )
            )
        return out

    async def trajectories(
        self, rows: Sequence[AgentRow], sampling: SamplingParams, generate_tokens: GenerateTokens
    ) -> list[Trajectory]:
        """`sampling.n` trajectories per row, row-major, all loops running concurrently."""
        n = sampling.n
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.mt.step_deadline_s if self.mt.step_deadline_s > 0 else None
        cut: set[tuple[int, int]] = set()

        def generator(row: int, sample: int) -> Generate:
            turn = 0

            async def generate(
                prompt_ids: list[int], budget: int, /, multi_modal: dict[str, Any] | None = None
            ) -> GenerationOutput:
                nonlocal turn
                seed = None if sampling.seed is None else trajectory_seed(sampling.seed, row, sample, n, turn)
                params = dataclasses.replace(
                    sampling, n=1, seed=seed, max_new_tokens=min(budget, sampling.max_new_tokens)
                )
                turn += 1
                call = (
                    generate_tokens(prompt_ids, params)
                    if multi_modal is None
                    else generate_tokens(prompt_ids, params, multi_modal=multi_modal)
                )
                if deadline is None:
                    return (await call)[0]
                try:  # past the step's deadline the turn is aborted (the engine frees its slot) and dropped
                    async with asyncio.timeout_at(deadline) as bound:
                        return (await call)[0]
                except TimeoutError:
                    if not bound.expired():
                        raise  # the engine's own timeout, not the deadline
                cut.add((row, sample))
                return GenerationOutput(f"deadline-{row}-{sample}", 0, (), (), FinishReason.ABORT)

            return generate

        tasks = [
            run_agent(dataclasses.replace(row, sample=j), generator(i, j), self.env)
            for i, row in enumerate(rows)
            for j in range(n)
        ]
        trajectories = list(await asyncio.gather(*tasks))
        for i, j in cut:
            trajectory = trajectories[i * n + j]
            trajectory.finish_reason = AgentFinishReason.DEADLINE
            trajectory.metrics["agent/deadline_cut"] = 1.0
        return trajectories

    def run(
        self,
        prompts: Batch,
        sampling: SamplingParams,
        generate_tokens: GenerateTokens,
        pad_token_id: int,
    ) -> Batch:
        """The rollout Batch of `prompts` (module docstring); runs its own event loop. The first call checks
        the chat template on its rows before generating (`preflight`)."""
        rows = self.rows(prompts)
        if self.template_verdict is None:
            self.preflight([row.messages for row in rows])
        trajectories = asyncio.run(self.trajectories(rows, sampling, generate_tokens))
        if self.mt.check_drift:
            for t in trajectories:
                if t.images is not None:
                    continue  # a re-render would not expand the image tokens: not measured
                renderer = self.env.renderer if self.env.tools else self.env.plain_renderer
                t.metrics["agent/token_drift"] = float(token_drift(renderer, t))
        batch = trajectories_to_batch(
            prompts, trajectories, sampling.n, pad_token_id, self.env.limits.max_response_tokens
        )
        columns = self._row_columns(batch, trajectories)
        if self.env.images is not None:  # every image of each trajectory, in order (docs/vision.md)
            columns["images"] = _objects([list(t.images.blobs) if t.images else [] for t in trajectories])
            columns["multi_modal_inputs"] = _objects(
                [t.images.inputs() if t.images else None for t in trajectories]
            )
        replaced = [k for k in ("extra_info", "images", "multi_modal_inputs") if k in batch.non_tensors]
        return batch.drop(*replaced).union(Batch({}, columns, batch_size=len(batch)))

    def _row_columns(self, batch: Batch, trajectories: Sequence[Trajectory]) -> dict[str, np.ndarray]:
        tokenizer = self.env.renderer.tokenizer
        extras = list(batch.non_tensors["extra_info"]) if "extra_info" in batch.non_tensors else []
        new_extra, metrics = [], []
        for i, t in enumerate(trajectories):
            finals = [m for m in t.messages if m.get("role") == "assistant"]
            final = str(finals[-1]["content"]) if finals else ""
            clean = tokenizer.decode(
                tokenizer.encode(final, add_special_tokens=False), skip_special_tokens=True
            )
            base = dict(extras[i]) if i < len(extras) and isinstance(extras[i], Mapping) else {}
            new_extra.append(
                {**base, "final_message": clean, "num_turns": t.assistant_turns, "env_reward": t.reward}
                | ({"env_error": t.error} if t.error else {})
            )
            metrics.append(dict(t.metrics))
        return {
            "extra_info": np.array(new_extra, dtype=object),
            "agent_metrics": np.array(metrics, dtype=object),
        }
