"""verifiers environments (prime-rl's `verifiers`, its classic API) run through quartet's environment seam.

    rows("my-env", {"difficulty": 2})   # the environment's dataset as prompt rows (verl's layout)
    # rows name the environment `verifiers`; each episode is played by `VerifiersEnvironment`
    # (quartet.environments.verifiers_episode):
    #   reset  -> verifiers' own state for the row (init_state, setup_state), its prompt
    #   step   -> the model's turn added to that state; the env's stop conditions; else env_response
    #   done   -> the env's cleanup, then its rubric's score_rollout: the final step's reward

An environment is found as `vf.load_environment` finds one: `env_id`'s last `/` part, `-` read as `_`, is
imported as a module whose `load_environment(**env_args)` builds it (an installed package, or a module on
`PYTHONPATH`: the rollout workers import it too). It is loaded once per process and kept (`load`), by
the first episode's constructor: outside `rollout.multi_turn.env_timeout_s`, which bounds each call.

What maps to what:
- **dataset -> rows** (`rows`): each dataset row's `prompt` (verifiers builds it from `question` and the
  env's system prompt) is the row's prompt; the rest of the dataset row (`answer`, `info`, `task`, any
  other column) travels as JSON in `extra_info.env_kwargs.example`, so the episode rebuilds verifiers'
  state from the same input verifiers' own evaluation would use. `data_source` is `env/verifiers/<env_id>`
  (scored by the episode's reward), `agent_name` is `environment`.
- **env_response -> step**: a model turn becomes an assistant message (with `tool_calls` when quartet's
  parser read calls in it, ids `call_<turn>_<k>`) appended to verifiers' trajectory; if none of the env's
  stop conditions fires (`max_turns`, `ToolEnv`'s no-tool-call stop, `@vf.stop` methods), the env's
  `env_response` answers and its messages are the step's. `ToolEnv` runs its python functions there, and
  its tool messages carry the calls' ids. A `SingleTurnEnv` ends after the first turn.
- **rubric -> reward**: when the episode ends (a stop condition, `final_env_response`, or one of
  quartet's limits: a turn cut at the token limit, no budget left, `max_assistant_turns`; the loop's
  `end` hook), verifiers' cleanup renders the completion and the env's rubric scores it
  (`score_rollout`: its reward functions, async or not, weighted and summed as verifiers does); that is
  the final step's reward, and the rubric's metrics (each function's value) are its `info`.

Errors: an id that cannot be loaded is a `VerifiersLoadError` naming the id, the module tried and the
fix. A reward function that raises (verifiers itself logs it and counts 0) fails the row (the seam's
`env_error`), as does an `env_response` that raises anything but a `vf.Error` (which, as in verifiers,
ends the rollout and is scored). Not supported: group reward functions (they need all of a prompt's
rollouts at once), `EnvGroup`, sandboxes and environments that override `rollout` itself.

Needs the `environments` extra (`verifiers==0.3.1`: the newest release accepting openai 3.x).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "DATA_SOURCE_PREFIX",
    "VERIFIERS",
    "VerifiersLoadError",
    "chat_message",
    "json_mapping",
    "load",
    "rows",
    "tool_schemas",
]

VERIFIERS = "verifiers"
"""The registered environment's name (rows' `extra_info.env_kwargs.name`)."""

DATA_SOURCE_PREFIX = "env/verifiers/"
"""Rows' data source is this plus the env id: scored by the episode's reward (`environments.scoring`)."""


class VerifiersLoadError(ValueError):
    """A verifiers environment could not be loaded, or is of a kind quartet cannot run."""


def json_mapping(env_args: str | Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """`env_args` (a mapping, or JSON text of one, as rows carry it) as a dict; `what` names it in the
    ValueError for anything else."""
    if env_args is None or env_args == "":
        return {}
    value = json.loads(env_args) if isinstance(env_args, str) else env_args
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a mapping (or JSON text of one), got {type(value).__name__}")
    return dict(value)


_LOADED: dict[tuple[str, str], Any] = {}
_LOAD_LOCK = threading.Lock()


class _KeepHandlers:
    """`signal` as verifiers' environment module sees it while one loads: everything but `signal()`,
    which would replace this process's SIGINT/SIGTERM handlers (and only works in the main thread)."""

    def __getattr__(self, name: str) -> Any:
        import signal

        return getattr(signal, name)

    @staticmethod
    def signal(signum: int, handler: Any) -> Any:
        return None


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """While a verifiers environment is built: its constructor installs SIGINT/SIGTERM handlers that exit
    the process; quartet's processes keep their own (graceful stop, preemption)."""
    from verifiers.legacy.envs import environment as module

    real = module.signal
    module.signal = _KeepHandlers()
    try:
        yield
    finally:
        module.signal = real


def load(env_id: str, env_args: str | Mapping[str, Any] | None = None) -> Any:
    """The verifiers environment `env_id` built with `env_args`, loaded once per process (as
    `vf.load_environment` loads it; module doc). A `VerifiersLoadError` names the id, the module tried,
    what failed and the fix; an environment quartet cannot run (group rubric, not a `MultiTurnEnv`) too."""
    args = json_mapping(env_args, "env_args")
    key = (env_id, json.dumps(args, sort_keys=True, default=str))
    with _LOAD_LOCK:
        if key not in _LOADED:
            try:
                _LOADED[key] = _load_uncached(env_id, args)
            except VerifiersLoadError as err:  # kept too: every row of a bad id fails fast, the same way
                _LOADED[key] = err
        found = _LOADED[key]
    if isinstance(found, VerifiersLoadError):
        raise VerifiersLoadError(str(found))
    return found


def _load_uncached(env_id: str, args: dict[str, Any]) -> Any:
    if not isinstance(env_id, str) or not env_id:
        raise VerifiersLoadError(f"env_id must name a verifiers environment, got {env_id!r}")
    import verifiers.legacy as vf
    from verifiers.legacy.utils.env_utils import env_module_name, load_environment

    module = env_module_name(env_id)
    try:
        with _own_signal_handlers():
            env = load_environment(env_id, **args)
    except Exception as err:  # verifiers wraps import and constructor failures; say what was tried
        cause = err.__cause__ or err
        raise VerifiersLoadError(
            f"verifiers environment {env_id!r} (env_args {args}) could not be loaded: tried importing module "
            f"{module!r} (verifiers' rule: the id's last '/' part, '-' read as '_') and calling its "
            f"load_environment(**env_args); {type(cause).__name__}: {cause}. Fix: install the "
            f"environment's package, or put the folder holding {module}.py on PYTHONPATH (rollout workers "
            "import it too), and check env_args against its load_environment's parameters"
        ) from err
    if not isinstance(env, vf.MultiTurnEnv):
        raise VerifiersLoadError(
            f"verifiers environment {env_id!r} is a {type(env).__name__}: quartet runs the MultiTurnEnv "
            "family (SingleTurnEnv, MultiTurnEnv, ToolEnv, StatefulToolEnv); EnvGroup and others are not "
            "supported"
        )
    if env.rubric.has_group_rewards or env.provides_advantages:
        raise VerifiersLoadError(
            f"verifiers environment {env_id!r}: its rubric has group reward functions or gives advantages, "
            "which need all of a prompt's rollouts at once; quartet scores each episode alone and its "
            "estimator makes the advantages (use per-rollout reward functions)"
        )
    return env


def chat_message(message: Any, names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A verifiers message (pydantic or dict) as a chat dict with text content; a `tool` message also
    names its tool from `names` (call id -> tool name; templates such as Hermes' need it). Content other
    than text is a ValueError."""
    raw = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    role, content = raw.get("role"), raw.get("content")
    if isinstance(content, list):  # content parts: quartet's text models read the text ones
        kinds = {str(p.get("type")) for p in content if isinstance(p, Mapping)}
        if kinds - {"text"}:
            raise ValueError(
                f"a {role} message holds {sorted(kinds - {'text'})} content: only text is supported"
            )
        content = "".join(str(p.get("text", "")) for p in content)
    out: dict[str, Any] = {"role": role, "content": "" if content is None else str(content)}
    if role == "tool":
        call_id = str(raw.get("tool_call_id", ""))
        out["tool_call_id"] = call_id
        out["name"] = (names or {}).get(call_id, "tool")
    return out


def rows(
    env_id: str,
    env_args: Mapping[str, Any] | None = None,
    split: str = "train",
    count: int = -1,
    seed: int | None = None,
) -> list[dict[str, Any]]:
    """Prompt rows of the environment's dataset (`split` `train`) or eval dataset (`eval`; verifiers falls
    back to the train set when it has none): the first `count` (all: -1), shuffled by `seed` first if
    given, in verl's layout (module doc). A dataset cell that JSON cannot carry is a ValueError naming
    the row and column."""
    env = load(env_id, env_args)
    args = json.dumps(json_mapping(env_args, "env_args"), sort_keys=True)
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    dataset = env.get_dataset(count, seed) if split == "train" else env.get_eval_dataset(count, seed)
    out = []
    for k, example in enumerate(dataset.to_list()):
        fields = {key: value for key, value in example.items() if key != "prompt"}
        where = f"verifiers environment {env_id!r}, {split} row {k}"
        if not isinstance(example.get("prompt"), list):
            raise ValueError(f"{where}: its prompt must be chat messages, got {type(example.get('prompt'))}")
        try:
            prompt = [chat_message(m) for m in example["prompt"]]
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err
        for key, value in fields.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError) as err:
                raise ValueError(f"{where}, column {key!r}: {err}; rows carry its columns as JSON") from err
        text = json.dumps(fields)
        out.append({
            "data_source": DATA_SOURCE_PREFIX + env_id,
            "prompt": prompt,
            "ability": "verifiers",
            "reward_model": {"style": "rule", "ground_truth": str(fields.get("answer", ""))},
            "agent_name": "environment",
            "extra_info": {"split": split, "index": k, "env_kwargs": {
                "name": VERIFIERS, "env_id": env_id, "env_args": args, "example": text}},
        })  # fmt: skip
    return out


def tool_schemas(tool_defs: list[Any]) -> list[dict[str, Any]]:
    """verifiers' tool definitions (`vf.Tool`: name, description, parameters) as OpenAI function schemas."""
    out = []
    for tool in tool_defs:
        raw = tool.model_dump(exclude_none=True) if hasattr(tool, "model_dump") else dict(tool)
        function = {k: raw[k] for k in ("name", "description", "parameters") if k in raw}
        out.append({"type": "function", "function": function})
    return out
