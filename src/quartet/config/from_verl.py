"""Translate a verl command line (Hydra overrides) or a verl YAML config into a quartet config.

    t = translate_overrides(["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=5"])
    t.quartet_values     # {"algorithm.adv_estimator": "grpo", "rollout.n": 5, ...}
    t.unmapped           # every verl key with no quartet equivalent, with the reason
    cfg = t.build()      # a validated QuartetConfig, or a FromVerlError naming the verl keys at fault

The key table lives in `quartet.config.verl_keys`, the keys with no counterpart in `verl_unmapped`. verl
keys a command line does not set keep verl's default where quartet's default would change the algorithm
or the batch shape (`VERL_DEFAULTS`: verl's `gae` estimator, `rollout.n=1`, its batch sizes and lengths);
everything else keeps quartet's default.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quartet.config.docs import iter_field_docs
from quartet.config.errors import ConfigError
from quartet.config.loader import from_dict
from quartet.config.root import QuartetConfig
from quartet.config.validate import validate
from quartet.config.verl_keys import RULES, VERL_DEFAULTS, Context, Skip
from quartet.config.verl_unmapped import PREFIX_REASONS, UNMAPPED
from quartet.config.yaml_io import parse_scalar

__all__ = [
    "FILE_KEYS",
    "Conversion",
    "FileLoader",
    "FromVerlError",
    "Translation",
    "Unmapped",
    "flatten_verl_tree",
    "parse_verl_overrides",
    "translate",
    "translate_overrides",
    "translate_tree",
]


FILE_KEYS: dict[str, str] = {
    "rollout.multi_turn.tool_config_path": "tools file",
    "rollout.multi_turn.interaction_config_path": "interactions file",
    "data.train_files": "training data file",
    "data.val_files": "validation data file",
    "reward.function": "reward function file",
}
"""quartet fields the translation fills with paths of files the run reads: `quartet config from-verl`
checks each exists (and that the tools and interactions files load), `Translation.file_problems`."""

FileLoader = Callable[[str], object]
"""Reads a file the translated config names (e.g. `quartet.agents.tools.registry.load_tools`); raises a
ValueError or OSError whose message says why it does not load."""


@dataclass(frozen=True)
class Unmapped:
    """A verl key that has no quartet field (or whose value has no quartet equivalent), and why."""

    key: str
    value: Any
    reason: str


@dataclass(frozen=True)
class Conversion:
    """One verl value that landed in a quartet field; `how` is empty when it was copied unchanged."""

    verl_key: str
    verl_value: Any
    quartet_key: str
    quartet_value: Any
    how: str = ""
    from_default: bool = False  # verl's default, applied because the command line did not set it
    fallback: bool = False  # yields to any other source of the same quartet field (verl's `clip_ratio`)
    applied: bool = True
    """Whether `how` applied: a value mapping (`-1 (never) -> 0`) applies only when it changed the value;
    the report prints `how` only then (`trainer.test_freq=5` is copied, and says nothing)."""


@dataclass(frozen=True)
class Translation:
    """The result of a translation: the quartet values, where each came from, and what was dropped."""

    conversions: tuple[Conversion, ...]
    unmapped: tuple[Unmapped, ...]
    quartet_values: dict[str, Any] = field(default_factory=dict)

    def overrides(self) -> list[str]:
        """The translation as quartet `key=value` overrides (what `quartet train cfg.yaml ...` accepts)."""
        return [f"{k}={_format_value(v)}" for k, v in self.quartet_values.items()]

    def tree(self) -> dict[str, Any]:
        """The translation as a nested mapping of sections (a partial quartet YAML config)."""
        out: dict[str, Any] = {}
        for key, value in self.quartet_values.items():
            node = out
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return out

    def sources(self, quartet_key: str) -> list[Conversion]:
        """The verl values that produced `quartet_key` (several when verl spells one thing twice)."""
        return [c for c in self.conversions if c.quartet_key == quartet_key]

    def build(
        self, check: bool = True, files: Mapping[str, FileLoader | None] | None = None
    ) -> QuartetConfig:
        """The quartet config (unset fields keep quartet's defaults), validated unless `check=False`.

        `files`: check the files the config names (`file_problems`; None: no check). Raises FromVerlError
        naming each failing quartet field with the verl key and value behind it.
        """
        problems: list[str] = []
        for key, value in self.quartet_values.items():  # each value alone: all bad values, not the first
            try:
                from_dict(QuartetConfig, Translation((), (), {key: value}).tree(), source="from-verl")
            except ConfigError as err:
                problems.append(self._explain(err))
        if files is not None:
            problems += self.file_problems(files)
        if problems:
            raise FromVerlError(problems)
        cfg = from_dict(QuartetConfig, self.tree(), source="from-verl")
        if not check:
            return cfg
        try:
            return validate(cfg)
        except ConfigError as err:
            raise FromVerlError([self._explain(err)]) from None

    def file_problems(self, loaders: Mapping[str, FileLoader | None]) -> list[str]:
        """The files the translated config names (`FILE_KEYS`) that are missing, or that do not load with
        `loaders[key]` (a key without a loader: only that the file exists); each problem names the quartet
        key, the path, the reason and the verl key and value behind it."""
        problems = []
        for key, what in FILE_KEYS.items():
            for path in _named_files(key, self.quartet_values.get(key)):
                reason, fix = _file_reason(path, loaders.get(key), what)
                if reason:
                    problems.append(self._explain(ConfigError(key, f"{path}: {reason}", fix)))
        return problems

    def _explain(self, err: ConfigError) -> str:
        """The error's text with, under each problem, the verl keys and values behind its fields."""
        if err.field and not err.problem.startswith(tuple(f"{n} config problems" for n in range(2, 99))):
            blocks = [str(ConfigError(err.field, err.problem, err.fix))]
        else:  # validate() joined several problems: "- field: problem\n  fix: ..." per problem
            blocks = ["- " + b for b in str(err).split("\n- ")[1:]] or [str(err)]
        out = []
        for block in blocks:
            field_name = block.removeprefix("- ").split(":", 1)[0]
            origin = "; ".join(_origin(c) for c in self.sources(field_name))
            out.append(block.removeprefix("- ") + (f"\n  translated from: {origin}" if origin else ""))
        return "\n- ".join(out)


class FromVerlError(ConfigError):
    """Translated values that quartet refuses; each problem names the verl key and value it came from."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("", "\n".join(f"- {p}" for p in self.problems))

    def __str__(self) -> str:
        return "the translated config does not validate:\n" + self.problem


def parse_verl_overrides(items: Iterable[str]) -> tuple[dict[str, Any], list[Unmapped]]:
    """Hydra `key=value` items to {dotted key: value}; `+`/`++` prefixes are dropped, `~key` is refused."""
    values: dict[str, Any] = {}
    bad: list[Unmapped] = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if key.startswith("~"):
            bad.append(Unmapped(key, None, "a Hydra deletion; quartet fields cannot be deleted"))
            continue
        if not sep or not key:
            bad.append(Unmapped(item, None, "not a key=value override"))
            continue
        added = key.startswith("+") and not key.startswith("++")
        key = key.lstrip("+")
        try:
            value = parse_scalar(raw)
        except Exception as err:  # yaml's error types vary; the message names the value
            bad.append(Unmapped(key, raw, f"the value is not valid YAML/Hydra ({err})"))
            continue
        if added and not _is_known(key):
            bad.append(Unmapped(key, value, "added with '+': not a key of verl's config (a recipe's own)"))
            continue
        values[key] = value
    return values, bad


def flatten_verl_tree(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested verl YAML config as {dotted key: value}; Hydra's `defaults` list is dropped."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if not prefix and key == "defaults":
            continue
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten_verl_tree(value, path))
        else:
            out[path] = value
    return out


def translate_overrides(items: Iterable[str], verl_defaults: bool = True) -> Translation:
    """Translate a verl command line's overrides (`actor_rollout_ref.actor.optim.lr=1e-6 ...`)."""
    values, bad = parse_verl_overrides(items)
    t = translate(values, verl_defaults)
    return Translation(t.conversions, (*bad, *t.unmapped), t.quartet_values)


def translate_tree(
    tree: Mapping[str, Any], verl_defaults: bool = True, overrides: Iterable[str] = ()
) -> Translation:
    """Translate a verl YAML config (nested sections), then `overrides` on top of it as Hydra does.

    Whole-value `${a.b}` references are resolved within the config; other interpolations are reported.
    """
    flat = flatten_verl_tree(tree)
    extra, bad = parse_verl_overrides(overrides)
    flat.update(extra)
    resolved: dict[str, Any] = {}
    for key, value in flat.items():
        try:
            resolved[key] = _resolve(value, flat, depth=0)
        except KeyError as err:
            bad.append(Unmapped(key, value, f"an interpolation quartet cannot resolve ({err.args[0]})"))
    t = translate(resolved, verl_defaults)
    return Translation(t.conversions, (*bad, *t.unmapped), t.quartet_values)


def translate(values: Mapping[str, Any], verl_defaults: bool = True) -> Translation:
    """Translate {dotted verl key: value}; see the module docstring."""
    given = dict(values)
    effective = {**VERL_DEFAULTS, **given} if verl_defaults else given
    ctx = Context(effective)
    conversions: list[Conversion] = []
    unmapped: list[Unmapped] = []
    for key, value in effective.items():
        if key not in given and key not in RULES:
            continue
        rule = RULES.get(key)
        if rule is None:
            unmapped.append(Unmapped(key, value, _reason(key)))
            continue
        if value is None and not rule.takes_null:
            reason = (
                f"null (unset in verl, no default of its own): quartet's default for {rule.target} applies"
            )
            unmapped.append(Unmapped(key, value, reason))
            continue
        try:
            converted = rule.convert(value, ctx) if rule.convert else value
        except Skip as skip:
            unmapped.append(Unmapped(key, value, str(skip)))
            continue
        except (TypeError, ValueError) as err:
            unmapped.append(Unmapped(key, value, f"value cannot be converted ({err})"))
            continue
        applied = not rule.value_note or not _same_value(value, converted)
        for target in (rule.target, *rule.also):
            conversions.append(
                Conversion(key, value, target, converted, rule.how, key not in given, rule.fallback, applied)
            )
    conversions += _derived(effective, given, conversions)
    if str(effective.get("algorithm.adv_estimator", "")) != "gae":
        # No critic in the run: drop critic values that only verl's defaults or the actor's keys produced.
        conversions = [
            c for c in conversions if not c.quartet_key.startswith("critic.") or _given_critic(c, given)
        ]
    if "actor_rollout_ref.model.path" not in given:
        reason = "not given: verl's default is a placeholder folder; quartet builds its tiny test model"
        unmapped.append(Unmapped("actor_rollout_ref.model.path", None, reason))
    merged, clashes = _merge(conversions)
    order = {path: i for i, (path, _) in enumerate(iter_field_docs(QuartetConfig))}
    quartet_values = dict(sorted(merged.items(), key=lambda kv: order.get(kv[0], len(order))))
    return Translation(tuple(conversions), (*unmapped, *clashes), quartet_values)


def _derived(
    effective: Mapping[str, Any], given: Mapping[str, Any], done: list[Conversion]
) -> list[Conversion]:
    """Values verl derives from others: the critic's mini-batch and epochs follow the actor's; GPUs."""
    out: list[Conversion] = []
    targets = {c.quartet_key for c in done}
    actor = "actor_rollout_ref.actor"
    follow = {  # verl's config interpolates these from the actor's (or the critic's own) keys
        "critic.mini_batch_size": f"{actor}.ppo_mini_batch_size",
        "critic.epochs": f"{actor}.ppo_epochs",
        "critic.use_dynamic_batch": f"{actor}.use_dynamic_bsz",
        "critic.values.use_dynamic_batch": f"{actor}.use_dynamic_bsz",
        "actor.logprobs.use_dynamic_batch": f"{actor}.use_dynamic_bsz",
        "reference.logprobs.use_dynamic_batch": f"{actor}.use_dynamic_bsz",
        "actor.logprobs.max_tokens_per_micro_batch": f"{actor}.ppo_max_token_len_per_gpu",
        "reference.logprobs.max_tokens_per_micro_batch": f"{actor}.ppo_max_token_len_per_gpu",
        "critic.values.micro_batch_size_per_device": "critic.ppo_micro_batch_size_per_gpu",
    }
    for target, source in follow.items():
        if target not in targets and source in effective:
            how = f"verl's default for it follows {source}"
            out.append(
                Conversion(source, effective[source], target, effective[source], how, source not in given)
            )
    device = str(effective.get("trainer.device", "cuda"))
    if "cluster.device" not in targets and device == "cuda":
        how = "verl places every worker on a GPU"
        out.append(
            Conversion("trainer.device", "cuda", "cluster.device", "gpu", how, "trainer.device" not in given)
        )
    return out


def _same_value(verl: Any, quartet: Any) -> bool:
    """Whether a conversion left the value as it was (same type and value: `5 -> 5`, not `-1 -> 0`,
    `'a' -> ['a']`, `'vllm' -> 'vllm'` same, `True -> 'filter'` not)."""
    return type(verl) is type(quartet) and verl == quartet


def _given_critic(c: Conversion, given: Mapping[str, Any]) -> bool:
    return c.verl_key in given and c.verl_key.startswith("critic.")


def _merge(conversions: Sequence[Conversion]) -> tuple[dict[str, Any], list[Unmapped]]:
    """One value per quartet field; a verl key that disagrees with an earlier one for the same field is
    reported (given keys win over verl's defaults)."""
    out: dict[str, Any] = {}
    owner: dict[str, Conversion] = {}
    clashes: list[Unmapped] = []
    for c in sorted(conversions, key=lambda c: (c.from_default, c.fallback)):
        first = owner.get(c.quartet_key)
        if first is None:
            out[c.quartet_key], owner[c.quartet_key] = c.quartet_value, c
        elif first.quartet_value != c.quartet_value and not c.from_default and not c.fallback:
            reason = f"conflicts with {first.verl_key}={_format_value(first.verl_value)} ({c.quartet_key})"
            clashes.append(Unmapped(c.verl_key, c.verl_value, reason))
    return out, clashes


def _named_files(key: str, value: Any) -> list[str]:
    """The file paths in a `FILE_KEYS` value: a path, a list of paths, or `file.py:function`."""
    if not value:
        return []
    if key == "reward.function":
        path, sep, _ = str(value).rpartition(":")
        return [path] if sep and path.endswith(".py") else []  # `package.module:fn` is not a file
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]


def _file_reason(path: str, loader: FileLoader | None, what: str) -> tuple[str, str]:
    """Why `path` cannot serve as the `what` file and how to fix it (("", "") when it can).

    A missing file's fix is its path; a file that does not load keeps the loader's own fix: the cause of the
    error that carries `problem` and `fix` (e.g. `quartet.agents.verl_compat.VerlClassError`: a verl class
    with no quartet equivalent, answered with quartet's classes and how to port it), else the message."""
    where = f"give the path of the {what} (relative paths are read from where quartet runs)"
    if not os.path.exists(path):
        return "no such file", where
    if not os.path.isfile(path):
        return "not a file", where
    if loader is None:
        return "", ""
    try:
        loader(path)
    except (OSError, ValueError) as err:
        cause: BaseException | None = err
        while cause is not None and not isinstance(getattr(cause, "fix", None), str):
            cause = cause.__cause__
        fix = str(getattr(cause, "fix", "")) if cause is not None else ""
        if fix:
            return f"does not load: {str(err).removesuffix(f'; {fix}')}", fix
        return f"does not load: {err}", f"correct the {what} as the error says"
    return "", ""


def _known_keys() -> list[str]:
    return [*RULES, *UNMAPPED]


def _is_known(key: str) -> bool:
    return key in RULES or key in UNMAPPED


def _reason(key: str) -> str:
    if key in UNMAPPED:
        return UNMAPPED[key]
    close = difflib.get_close_matches(key, _known_keys(), n=2, cutoff=0.92)  # a typo inside a known subtree
    if close:
        return "unknown verl key; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    for prefix, reason in PREFIX_REASONS.items():
        if key.startswith(prefix) or key == prefix.rstrip("."):
            return reason
    close = difflib.get_close_matches(key, _known_keys(), n=2, cutoff=0.8)
    if close:
        return "unknown verl key; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    return "not a verl key quartet knows (no quartet equivalent)"


def _resolve(value: Any, flat: Mapping[str, Any], depth: int) -> Any:
    """Resolve a whole-value `${a.b}` reference (OmegaConf's simplest form) against the flat config."""
    if not (isinstance(value, str) and value.startswith("${") and value.endswith("}")):
        return value
    ref = value[2:-1]
    if ":" in ref or ref not in flat or depth > 8:
        raise KeyError(value)
    return _resolve(flat[ref], flat, depth + 1)


def _origin(c: Conversion) -> str:
    return f"{c.verl_key}={_format_value(c.verl_value)}" + (" (verl's default)" if c.from_default else "")


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_format_value(v) for v in value) + "]"
    return str(value)
