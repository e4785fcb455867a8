"""Which rule scores a response: chosen by the row's `data_source`, the way verl's default scorer does.

| data_source                                                 | scorer                                    |
|-------------------------------------------------------------|-------------------------------------------|
| `openai/gsm8k`, `gsm8k`                                     | `gsm8k.compute_score_verl` (verl's rule)  |
|                                                             | or `gsm8k.compute_score` (lenient)        |
| `lighteval/MATH`, `math`, `DigitalLearningGmbH/MATH-lighteval`, `HuggingFaceH4/MATH-500`                |
|                                                             | `math_verl` (verl's rule; not `math`)     |
|                                                             | or `math_answers` (lenient, last box)     |
| `math_dapo`, `aime...` (any name starting with `aime`)      | the same, or the last `Answer:` line      |
| `reasoning_gym/<task>` (`quartet.environments.reasoning_gym`) | reasoning-gym's own verifier of the task |
| `env/<name>` (rows an environment ran, `quartet.environments`) | the episode's reward (`env_reward`)     |
| a built-in task's name (`arithmetic`, ...)                  | the task's own verifier                   |

Two modes (`reward.rule_mode`, see `RULE_FUNCTIONS`): `verl` (the default, `default_compute_score`) scores
GSM8K exactly as verl 0.9.1 does (last 300 characters, `#### <number>`, string equality), so rewards on
verl's data match a verl run; `lenient` (`lenient_compute_score`) uses quartet's lenient GSM8K rule
(whole response, `####42` and `#### 42.0` accepted). The MATH sources verl scores with its Hendrycks-style
rule (`VERL_MATH_SOURCES`) use `math_verl` in verl mode and `math_answers` in lenient mode. `math`,
`math_dapo` and `aime*` use `math_answers` in both modes: verl scores them with its DAPO rule (+1/-1,
`Answer:` line), which quartet does not reproduce (a departure; use `reward.function` for it).

Anything else is an `UnknownDataSourceError` that names the data source, the known ones, and the fix
(`reward.function`). The choice is an explicit table, not a plug-in registry: a custom scorer is one
`reward.function` away, and a typo in a data source fails on the driver before any worker scores a row.

Built-in tasks are looked up lazily through `quartet.tasks.task_scorer(data_source)`, whose task
functions have the signature `compute_score(solution_str, ground_truth, extra_info=None)`; they are
adapted to verl's. When that registry is not there, `arithmetic` falls back to its `verify_answer`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from quartet.rewards.registry import import_inherited_modules, registered_rewards
from quartet.rewards.rules import gsm8k, math_answers, math_verl
from quartet.rewards.scoring import ScoreFn

__all__ = [
    "GSM8K_SOURCES",
    "RULE_FUNCTIONS",
    "lenient_compute_score",
    "MATH_SOURCES",
    "UnknownDataSourceError",
    "default_compute_score",
    "known_data_sources",
    "select_scorer",
]

GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")
MATH_SOURCES = ("lighteval/MATH", "math", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
VERL_MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
"""The sources verl scores with its Hendrycks-style `math` rule (`math_verl`) in `rule_mode=verl`."""
ANSWER_LINE_SOURCES = ("math_dapo",)
ANSWER_LINE_PREFIX = "aime"
ENV_PREFIX = "env/"
"""Rows an environment ran (`quartet.environments`): scored by the episode's reward."""
REASONING_GYM_PREFIX = "reasoning_gym/"
"""Rows of `quartet.environments.reasoning_gym`: scored by reasoning-gym's own verifier of the task."""


class UnknownDataSourceError(KeyError):
    """No rule scorer for a data source; the message lists the known ones and the fix."""

    def __str__(self) -> str:  # KeyError would print the message quoted, on one line
        return str(self.args[0]) if self.args else ""


class _TaskScorer:
    """A built-in task's `compute_score(solution_str, ground_truth, extra_info)` under verl's signature."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any:
        return self.fn(solution_str, ground_truth, extra_info)


def _arithmetic_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    from quartet.tasks.arithmetic import verify_answer

    return 1.0 if verify_answer(solution_str, str(ground_truth)) else 0.0


def _task_module() -> Any:
    try:
        import quartet.tasks as tasks
    except ImportError:
        return None
    return tasks


def _builtin_task_names() -> list[str]:
    """Data sources of the built-in tasks, for error messages (`TASKS` values carry `data_source`)."""
    tasks = getattr(_task_module(), "TASKS", None)
    if isinstance(tasks, Mapping):
        return sorted(str(getattr(task, "data_source", name)) for name, task in tasks.items())
    return ["arithmetic"]


def _task_scorer(data_source: str) -> ScoreFn | None:
    tasks = _task_module()
    finder = getattr(tasks, "task_scorer", None)
    fn = finder(data_source) if finder is not None else None
    if fn is None and data_source == "arithmetic":
        fn = _arithmetic_score
    return _TaskScorer(fn) if fn is not None else None


def known_data_sources() -> list[str]:
    """Every data source with a rule scorer (`aime*` stands for any name starting with `aime`)."""
    return [
        *registered_rewards(),
        *GSM8K_SOURCES,
        *MATH_SOURCES,
        *ANSWER_LINE_SOURCES,
        f"{ANSWER_LINE_PREFIX}*",
        f"{ENV_PREFIX}<name>",
        f"{REASONING_GYM_PREFIX}<task>",
        *_builtin_task_names(),
    ]


def select_scorer(data_source: str, mode: str = "verl") -> ScoreFn:
    """The rule scorer of `data_source` (verl's signature) in `mode` (`verl` or `lenient`, see the module
    docstring); `UnknownDataSourceError` when there is none.

    A scorer registered with `@register_reward` in algorithm.custom_module comes first and is looked up on
    every call (a registration takes effect at once); only the built-in choice is cached."""
    if mode not in RULE_FUNCTIONS:
        raise ValueError(f"rule mode must be one of {sorted(RULE_FUNCTIONS)}, got {mode!r}")
    custom = registered_rewards().get(data_source)
    if custom is not None:
        return custom
    return _builtin_scorer(data_source, mode)


@functools.lru_cache(maxsize=256)
def _builtin_scorer(data_source: str, mode: str) -> ScoreFn:
    if data_source in GSM8K_SOURCES:
        return gsm8k.compute_score_verl if mode == "verl" else gsm8k.compute_score
    if data_source in VERL_MATH_SOURCES and mode == "verl":
        return math_verl.compute_score
    if data_source in MATH_SOURCES:
        return math_answers.compute_score
    if data_source in ANSWER_LINE_SOURCES or data_source.startswith(ANSWER_LINE_PREFIX):
        return functools.partial(math_answers.compute_score, answer_line=True)
    if data_source.startswith(ENV_PREFIX):
        from quartet.environments.scoring import compute_score as environment_score

        return environment_score
    if data_source.startswith(REASONING_GYM_PREFIX):
        from quartet.environments.reasoning_gym import compute_score as reasoning_gym_score

        return reasoning_gym_score
    task = _task_scorer(data_source)
    if task is not None:
        return task
    raise UnknownDataSourceError(
        f"no rule scorer for data_source {data_source!r}; known data sources: {known_data_sources()}\n"
        "  fix: set reward.function to path/to/file.py:function_name (or package.module:function_name), "
        "a function compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict"
    )


class _RuleScorer:
    """The function used when `reward.function` is empty: the rule of each row's data source.

    A class for its `warm_up`, which scoring workers call once before their first item: the built-in
    tasks live in `quartet.tasks`, whose import is slow (the config and the agent tools, about a second on an
    idle machine), and paid inside the first item's time limit it would time that item out.
    """

    def __init__(self, mode: str, name: str) -> None:
        self.mode = mode
        self.__name__ = name

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any:
        import_inherited_modules()  # a scoring worker: the driver's @register_reward modules (once each)
        return select_scorer(str(data_source), self.mode)(data_source, solution_str, ground_truth, extra_info)

    def warm_up(self) -> None:
        """Import what scoring may need, outside any item's time limit."""
        import_inherited_modules()
        _task_module()


default_compute_score = _RuleScorer("verl", "default_compute_score")
lenient_compute_score = _RuleScorer("lenient", "lenient_compute_score")

RULE_FUNCTIONS: Mapping[str, str] = {
    "verl": f"{__name__}:default_compute_score",
    "lenient": f"{__name__}:lenient_compute_score",
}
"""The function spec scoring workers load for each `reward.rule_mode` (when `reward.function` is empty)."""
