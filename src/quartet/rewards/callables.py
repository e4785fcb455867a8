"""Reward functions as plain Python callables: `RLTrainer(cfg, reward_funcs=[fn1, fn2], reward_weights=...)`.

Two signatures are accepted, told apart by the parameter names:

- TRL's (a parameter named `completions`): `fn(prompts, completions, **kwargs) -> list[float]`, called
  with lists: `prompts` are the rows' prompts as in the data set (chat messages), `completions` the decoded
  responses, `completion_ids` their token ids, and every other column of the batch (`ground_truth`,
  `data_source`, `extra_info`, `index`, ... and `rm_score` when a reward model ran) as a list under its own
  name. A function without `**kwargs` gets only the columns it names.
- quartet's (verl's) per-sample one: `fn(data_source, solution_str, ground_truth, extra_info)` returning
  a float or a dict with "score" (`scoring.read_score`); a reward model's score is in
  `extra_info["rm_score"]`, as for `reward.function`.

The functions are summed, weighted (default 1 each): S_i = sum_k w_k f_k(i). Each function's value is also
an extra metric, `reward/extra/<name>` (its batch mean; `<name>` is the function's `__name__`, made unique).

Where they run: in the scoring processes of `ScorePool`, one sample per call (a TRL function gets lists of
one), so they get the pool's time limit, crash isolation and parallelism like `reward.function`. The
`RewardFuncs` object travels to those processes pickled with cloudpickle (lambdas, closures and functions
of a script's `__main__` go by value; functions of importable modules by reference).

A function that raises, or returns something that is not one finite number for the sample (a list of the
wrong length, None, NaN), fails that sample with an error naming the function and the sample's dataset row;
the sample scores 0 and is counted in `reward/error_count` and named in `bad_rows.jsonl`, as for
`reward.function`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from quartet.rewards.custom import RewardFunctionError
from quartet.rewards.scoring import read_score

__all__ = ["RewardFuncs", "signature_style"]

TRL = "trl"
PER_SAMPLE = "per_sample"
_LIST = "a list with one finite number per completion (here: one)"
_SCORE = "a finite number, or a dict with a numeric 'score'"


def _name(fn: Any) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else str(name)


def signature_style(fn: Callable[..., Any], name: str) -> tuple[str, frozenset[str] | None]:
    """(`trl` or `per_sample`, the keyword names a TRL function takes; None when it takes **kwargs)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as err:
        raise RewardFunctionError(f"reward function {name!r}: cannot read its signature ({err})") from err
    params = signature.parameters
    if "completions" in params:
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return TRL, None
        return TRL, frozenset(params)
    try:
        signature.bind("data_source", "solution_str", "ground_truth", None)
    except TypeError:
        raise RewardFunctionError(
            f"reward function {name!r} has signature {signature}; a reward function is either TRL's "
            "fn(prompts, completions, **kwargs) -> list[float] (a parameter named 'completions') or "
            "fn(data_source, solution_str, ground_truth, extra_info) -> float"
        ) from None
    return PER_SAMPLE, None


class RewardFuncs:
    """Several reward functions, summed with weights; called once per sample in a scoring process.

    Call: `funcs(prompt, completion, columns, data_source)` -> {"score": S, <name>: f_k, ...}, where
    `columns` holds the sample's batch columns (`ground_truth`, `extra_info`, `completion_ids`, ...).
    """

    def __init__(self, funcs: Sequence[Callable[..., Any]], weights: Sequence[float] | None = None) -> None:
        """Check every function's signature and the weights here, in the caller, before any step."""
        funcs = list(funcs)
        if not funcs:
            raise ValueError("reward_funcs is empty: pass at least one function, or leave it out")
        for i, fn in enumerate(funcs):
            if not callable(fn):
                raise TypeError(f"reward_funcs[{i}] is a {type(fn).__name__}, not a callable")
        if weights is None:
            weights = [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ValueError(f"reward_weights has {len(weights)} entries for {len(funcs)} reward_funcs")
        for i, w in enumerate(weights):
            if not isinstance(w, int | float) or not math.isfinite(w):
                raise ValueError(f"reward_weights[{i}] is {w!r}; a weight must be a finite number")
        self.funcs = funcs
        self.weights = [float(w) for w in weights]
        self.names = _unique([_name(fn) for fn in funcs])
        self.styles = [signature_style(fn, name) for fn, name in zip(funcs, self.names, strict=True)]

    def __call__(
        self, prompt: Any, completion: str, columns: Mapping[str, Any], data_source: Any = None
    ) -> dict[str, float]:
        out: dict[str, float] = {}
        total = 0.0
        for fn, name, weight, (style, accepted) in zip(
            self.funcs, self.names, self.weights, self.styles, strict=True
        ):
            if style == TRL:
                value = self._trl(fn, name, accepted, prompt, completion, columns)
            else:
                value = self._per_sample(fn, name, completion, columns, data_source, out)
            out[name] = value
            total += weight * value
        out["score"] = total
        return out

    @staticmethod
    def _trl(
        fn: Callable[..., Any],
        name: str,
        accepted: frozenset[str] | None,
        prompt: Any,
        completion: str,
        columns: Mapping[str, Any],
    ) -> float:
        kwargs = {key: [value] for key, value in columns.items() if key not in ("prompts", "completions")}
        if accepted is not None:
            kwargs = {key: value for key, value in kwargs.items() if key in accepted}
        returned = fn(prompts=[prompt], completions=[completion], **kwargs)
        if isinstance(returned, str | bytes | Mapping) or not hasattr(returned, "__len__"):
            raise RewardFunctionError(_bad(name, columns, f"returned a {type(returned).__name__}", _LIST))
        values = list(returned)
        if len(values) != 1:
            raise RewardFunctionError(_bad(name, columns, f"returned {len(values)} values", _LIST))
        try:
            return read_score(values[0]).score
        except (TypeError, ValueError):
            raise RewardFunctionError(_bad(name, columns, f"returned [{values[0]!r}]", _LIST)) from None

    @staticmethod
    def _per_sample(
        fn: Callable[..., Any],
        name: str,
        completion: str,
        columns: Mapping[str, Any],
        data_source: Any,
        extras: dict[str, float],
    ) -> float:
        extra_info = columns.get("extra_info")
        if "rm_score" in columns and (extra_info is None or isinstance(extra_info, Mapping)):
            extra_info = {**(extra_info or {}), "rm_score": columns["rm_score"]}  # as for reward.function
        returned = fn(data_source, completion, columns.get("ground_truth"), extra_info)
        try:
            value = read_score(returned)
        except (TypeError, ValueError) as err:
            raise RewardFunctionError(_bad(name, columns, f"returned {returned!r} ({err})", _SCORE)) from None
        extras.update({f"{name}/{key}": number for key, number in value.extras.items()})
        return value.score


def _bad(name: str, columns: Mapping[str, Any], what: str, wanted: str) -> str:
    row = columns.get("index")
    where = f"dataset row {row}" if row is not None else "a sample"
    source = columns.get("data_source")
    if source is not None:
        where += f" (data source {source!r})"
    return f"reward function {name!r} {what} for {where}; it must return {wanted}"


def _unique(names: list[str]) -> list[str]:
    """Names made unique (`f`, `f_2`, ...) and never "score" (the key of the total)."""
    out: list[str] = []
    for name in names:
        base = "score_fn" if name == "score" else name
        candidate, n = base, 1
        while candidate in out:
            n += 1
            candidate = f"{base}_{n}"
        out.append(candidate)
    return out
