"""One episode of a verifiers environment: the environment `verifiers` of quartet's seam (module doc of
`quartet.environments.verifiers_env`, which loads the env and writes its rows).

    reset  -> verifiers' own state for the row (init_state, setup_state), its prompt
    step   -> the model's turn added to that state; the env's stop conditions; else env_response
    done   -> the env's cleanup, then its rubric's score_rollout: the final step's reward, metrics as info
    final  -> a turn quartet's limits end the episode after (ModelTurn.final): scored as done
    end    -> the same, when the env's own messages used up the budget (the loop's optional hook)
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from quartet.environments.base import Environment, EnvRow, ModelTurn, StepResult
from quartet.environments.registry import register_environment
from quartet.environments.verifiers_env import VERIFIERS, chat_message, json_mapping, load, tool_schemas

__all__ = ["VerifiersEnvironment"]

_RUBRIC_LOGGER = "verifiers.legacy.rubrics"
"""Where verifiers' rubrics log a reward function that raised (they score it 0 and go on)."""


class _RubricErrors(logging.Handler):
    """Collects, per episode (a context variable), the errors verifiers' rubrics log for reward functions
    that raised: verifiers scores those 0, quartet fails the row instead."""

    current: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
        "vf_rubric_errors", default=None
    )

    def __init__(self) -> None:
        super().__init__(logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        errors = self.current.get()
        if errors is not None:
            errors.append(record.getMessage())


_HANDLER = _RubricErrors()
logging.getLogger(_RUBRIC_LOGGER).addHandler(_HANDLER)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@register_environment(VERIFIERS)
class VerifiersEnvironment(Environment):
    """One episode of a verifiers environment on one row (module doc).

    Args (a row's `extra_info.env_kwargs`, over `rollout.multi_turn.environment_kwargs`):
        env_id: the verifiers environment (as `vf.load_environment` takes it).
        env_args: its `load_environment` arguments (a mapping, or JSON text of one).
        example: the dataset row but its prompt (`answer`, `info`, `task`, ...; mapping or JSON text).
    """

    def __init__(
        self,
        env_id: str,
        env_args: str | Mapping[str, Any] | None = None,
        example: str | Mapping[str, Any] | None = None,
    ) -> None:
        self.env_id = env_id
        self.env_args = json_mapping(env_args, "env_kwargs.env_args")
        self.example = json_mapping(example, "env_kwargs.example")
        # loaded here, once per process (then a lookup): outside reset's env_timeout_s, which a slow
        # first load (imports, building the dataset) would otherwise spend
        self.vf_env: Any = load(env_id, self.env_args)
        self.state: Any = None
        self.messages: list[Any] = []
        self.finished = False

    async def reset(self, row: EnvRow) -> list[dict[str, Any]]:
        """verifiers' state for the row (`init_state`, then the env's `setup_state`); its prompt."""
        import verifiers.legacy as vf

        rollout_input = {**self.example, "prompt": row.messages}
        rollout_input.setdefault("example_id", row.index if row.index is not None else 0)
        state = await self.vf_env.init_state(rollout_input, _no_client(), "quartet")
        try:
            state = await self.vf_env.setup_state(state) or state
        except vf.Error as err:  # as verifiers' rollout does: the rollout stops (has_error) and is scored
            state["error"] = err
        self.state = state
        self.messages = list(state["prompt"])
        return [chat_message(m) for m in self.messages]

    def tools(self) -> list[dict[str, Any]]:
        """The episode's tools (`info.tool_defs` of the row, else the env's) as OpenAI schemas."""
        return tool_schemas(list(self.state["tool_defs"] or [])) if self.state is not None else []

    async def step(self, turn: ModelTurn) -> StepResult:
        """Add the turn to verifiers' trajectory; the score if a stop condition fires, else env_response."""
        import verifiers.legacy as vf
        from verifiers.legacy.utils.message_utils import maybe_normalize_messages

        env, state = self.vf_env, self.state
        calls = [
            vf.ToolCall(id=c.id, name=c.name, arguments=json.dumps(dict(c.arguments)))
            for c in turn.tool_calls
        ]
        reply = vf.AssistantMessage(content=turn.text, tool_calls=calls or None)
        await env.add_trajectory_step(state, {
            "prompt": list(self.messages), "completion": [reply], "response": None, "tokens": None,
            "reward": None, "advantage": None, "is_truncated": turn.cut,
            "trajectory_id": state["trajectory_id"], "extras": {},
        })  # fmt: skip
        self.messages.append(reply)
        if turn.cut:
            state["is_truncated"] = True
        if turn.final or await env.is_completed(state):  # final: quartet's limits allow no more turns
            return await self.finish()
        try:
            answer = await env.env_response(list(self.messages), state)
        except vf.Error as err:
            state["error"] = err
            return await self.finish()
        answer = maybe_normalize_messages(answer, field_name="env_response")
        if state.get("final_env_response") is not None:
            return await self.finish()
        self.messages.extend(answer)
        names = {c.id: c.name for c in turn.tool_calls}
        return StepResult(messages=[chat_message(m, names) for m in answer])

    async def end(self, finish_reason: str) -> StepResult:
        """quartet's limits ended the episode after an `env_response` (its messages used up the response
        budget; the environment loop's optional hook): the rubric scores it still, as verifiers scores a
        rollout its own limits cut."""
        if not await self.vf_env.is_completed(self.state):
            self.state["stop_condition"] = f"quartet_{finish_reason}"
            self.state["is_truncated"] = finish_reason != "max_turns"
        return await self.finish()

    async def finish(self) -> StepResult:
        """The env's cleanup (renders the completion), then its rubric's score: the final step's result."""
        env, state = self.vf_env, self.state
        self.finished = True
        await env.is_completed(state)  # sets the stop fields a rubric may read, as verifiers' loop does
        await env.cleanup(state)
        errors: list[str] = []
        token = _RubricErrors.current.set(errors)
        try:
            if env.score_rollouts:
                await env.rubric.score_rollout(state)
            else:
                await env.rubric.dummy_score_rollout(state)
        finally:
            _RubricErrors.current.reset(token)
        await env.rubric.cleanup(state)
        if errors:
            raise RuntimeError(
                f"verifiers environment {self.env_id!r}: its rubric failed: {'; '.join(errors)}"
            )
        reward = state.get("reward")
        if not _number(reward):
            raise ValueError(f"verifiers environment {self.env_id!r}: its rubric gave reward {reward!r}")
        metrics = state.get("metrics") or {}
        info = {str(k): float(v) for k, v in metrics.items() if _number(v)}
        if state.get("error") is not None:
            info["vf_error"] = 1.0
        return StepResult(reward=float(reward), done=True, info=info)

    async def close(self) -> None:
        """An episode quartet ended (turn or token budget) still runs the env's cleanup handlers."""
        if self.state is not None and not self.finished:
            await self.vf_env.cleanup(self.state)


_CLIENT: Any = None


def _no_client() -> Any:
    """The `client` verifiers' `init_state` wants: quartet samples the turns, so any call on it raises."""
    global _CLIENT
    if _CLIENT is None:
        from verifiers.legacy.clients.client import Client

        class QuartetSamples(Client):  # type: ignore[misc]
            def _refuse(self, *args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("quartet samples the model's turns: verifiers' client is never called")

            setup_client = _refuse
            to_native_tool = _refuse
            to_native_prompt = _refuse
            get_native_response = _refuse
            raise_from_native_response = _refuse
            from_native_response = _refuse
            close = _refuse

        _CLIENT = QuartetSamples(None)
    return _CLIENT
