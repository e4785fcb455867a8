"""reasoning-gym's procedural reasoning tasks as quartet prompt rows, scored by reasoning-gym's own verifiers.

`rows(tasks, count, seed)` draws `count` rows from a weighted mixture of tasks (`GymTask`: a reasoning-gym
dataset name, its config, its seed, its weight), in verl's row layout: `data_source`
`reasoning_gym/<task>`, the question as the user message (after reasoning-gym's system prompt unless
`system_prompt=None`), `reward_model.ground_truth` the task's answer, and `extra_info` naming the entry
(task, config as JSON, dataset seed and size, index). The same arguments give the same rows, whatever ran
before (a resumed run reads the same files; the draws use their own `random.Random`).

Scoring (`compute_score`, verl's signature; the rule scorer routes every `reasoning_gym/...` data source
here) rebuilds the entry from `extra_info` (reasoning-gym generates entry i of a (task, config, seed)
dataset deterministically) and returns the task's own `score_answer` on the text inside the response's
last `<answer>...</answer>` (reasoning-gym's `extract_answer`): partial credit where the task gives it
(e.g. 0.6 for a right answer wrapped in spaces on some tasks), so a reward equals what reasoning-gym's own
scorer says for the same answer. The entry's metadata is never stored in the row: JSON would turn its
tuples into lists, and some verifiers compare them.

Needs the `environments` extra (`reasoning-gym`; part of `make install`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DATA_SOURCE_PREFIX", "GymTask", "compute_score", "rows", "task_names"]

DATA_SOURCE_PREFIX = "reasoning_gym/"


@dataclasses.dataclass(frozen=True)
class GymTask:
    """One reasoning-gym dataset in a mixture.

    Args:
        name: the reasoning-gym dataset (`task_names()` lists them), e.g. `leg_counting`.
        config: keyword arguments of that dataset's config (its difficulty knobs), JSON-serialisable.
        seed: the dataset's seed (entry i of (name, config, seed) is always the same problem).
        size: how many distinct entries the dataset has (rows past it wrap around).
        weight: its share of the mixture (relative to the other tasks' weights).
    """

    name: str
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    size: int = 10_000
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in task_names():
            close = [n for n in task_names() if self.name.split("_")[0] in n][:8]
            raise ValueError(
                f"reasoning-gym has no task {self.name!r}" + (f" (close: {close})" if close else "")
                + "; reasoning_gym.task_names() lists them all"
            )  # fmt: skip
        if self.size < 1 or not self.weight > 0:
            raise ValueError(f"task {self.name}: size must be >= 1 and weight > 0")
        json.dumps(dict(self.config))  # a config must travel in the row as JSON


def task_names() -> list[str]:
    """Every reasoning-gym dataset name."""
    import reasoning_gym

    return sorted(reasoning_gym.factory.DATASETS)


@functools.lru_cache(maxsize=64)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def _system_prompt(style: str | None) -> str | None:
    if style is None:
        return None
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return str(SYSTEM_PROMPTS[style])


def rows(
    tasks: Sequence[GymTask], count: int, seed: int = 0, system_prompt: str | None = "default"
) -> list[dict[str, Any]]:
    """`count` prompt rows drawn from the weighted mixture of `tasks` (module doc).

    `seed` drives the mixture's draws only; each task's problems come from its own `GymTask.seed`. A
    validation set: the same tasks with other seeds. `system_prompt`: one of reasoning-gym's
    `SYSTEM_PROMPTS` styles (`default` asks for `<answer>...</answer>`), or None for none.
    """
    if not tasks:
        raise ValueError("rows: give at least one GymTask")
    draw = random.Random(seed)
    weights = [t.weight for t in tasks]
    taken = [0] * len(tasks)
    system = _system_prompt(system_prompt)
    out = []
    for _ in range(count):
        k = draw.choices(range(len(tasks)), weights)[0]
        task, index = tasks[k], taken[k] % tasks[k].size
        taken[k] += 1
        config = json.dumps(dict(task.config), sort_keys=True)
        entry = _dataset(task.name, config, task.seed, task.size)[index]
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": str(entry["question"])})
        out.append({
            "data_source": DATA_SOURCE_PREFIX + task.name,
            "prompt": messages,
            "ability": "reasoning",
            "reward_model": {"style": "rule", "ground_truth": str(entry["answer"])},
            "extra_info": {"task": task.name, "config": config, "seed": task.seed, "size": task.size,
                           "index": index},
        })  # fmt: skip
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """reasoning-gym's own score of the response's `<answer>` for the entry `extra_info` names (module doc).

    A row without the entry's address (`extra_info` task/config/seed/size/index) is a ValueError naming
    what is missing: reasoning-gym's verifiers need the entry, not only the answer string.
    """
    from reasoning_gym.utils import extract_answer

    info = extra_info if isinstance(extra_info, Mapping) else {}
    missing = [k for k in ("task", "config", "seed", "size", "index") if info.get(k) is None]
    if missing:
        raise ValueError(
            f"{data_source}: extra_info lacks {missing}; rows from quartet.environments.reasoning_gym.rows "
            "carry them (task, config, seed, size, index)"
        )
    dataset = _dataset(str(info["task"]), str(info["config"]), int(info["seed"]), int(info["size"]))
    entry = dataset[int(info["index"])]
    return float(dataset.score_answer(extract_answer(solution_str), entry))
