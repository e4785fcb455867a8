"""Build a typed config from YAML files and dotted CLI overrides, and turn it back into YAML.

Hand-written rather than OmegaConf: we want frozen dataclasses with enums and tuples, errors that name the
field, its source and the closest known key, and no second config object that library code could read
with `.get()`.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from quartet.config.errors import ConfigError
from quartet.config.root import QuartetConfig
from quartet.config.validate import validate
from quartet.config.yaml_io import dump_yaml, load_yaml, parse_scalar

__all__ = [
    "RENAMED_KEYS",
    "RenamedKey",
    "apply_overrides",
    "from_dict",
    "load_config",
    "load_saved_config",
    "to_dict",
    "to_yaml",
    "upgrade_renamed_keys",
]

T = TypeVar("T")
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RenamedKey:
    """A key that was renamed: where it lives now, and how its old values read under the new name."""

    new_path: str
    values: Mapping[str, str] = field(default_factory=dict)
    """Old value -> new value, where the values were renamed too."""


RENAMED_KEYS: Mapping[str, RenamedKey] = {
    "rollout.mode": RenamedKey("rollout.interface", {"sync": "batch", "async": "server"}),
}
"""Old dotted path -> its new name. An old key fails naming the new one (and the value to write there)
rather than being read silently: a config that still says `rollout.mode=async` was written for the old
meaning, and its author should see the new word once."""


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), check: bool = True
) -> QuartetConfig:
    """Read `path` (YAML, optional), apply `key=value` overrides, build and (by default) validate."""
    tree: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        check_config_file(p)
        loaded = load_yaml(p.read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError("", f"{p} holds a {type(loaded).__name__}, not a mapping of sections")
        tree = loaded or {}
        source = str(p)
    cfg = from_dict(QuartetConfig, tree, source=source)
    cfg = apply_overrides(cfg, overrides)
    return validate(cfg) if check else cfg


def check_config_file(p: Path) -> None:
    """Raise a ConfigError that says what `p` is when it is not a readable config file: missing, or a
    folder (naming the YAML files in it, which are likely what was meant)."""
    if p.is_dir():
        found = sorted(str(f) for f in p.glob("*.y*ml"))[:5]
        fix = f"pass one of: {', '.join(found)}" if found else "pass the path of a YAML config file"
        raise ConfigError("", f"config file {p} is a folder, not a file", fix)
    if not p.is_file():
        raise ConfigError("", f"config file {p} does not exist", "pass the path of a YAML config file")


def load_saved_config(path: str | Path) -> QuartetConfig:
    """The config a run or checkpoint folder saved (`config.yaml`), read as a config a user wrote, except
    that keys renamed since it was saved are read under their new names (a checkpoint written by an
    older quartet stays exportable; a user's own config still fails on an old key, see `RENAMED_KEYS`)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("", f"saved config {p} does not exist", "pass a run or checkpoint folder")
    tree = load_yaml(p.read_text()) or {}
    if not isinstance(tree, dict):
        raise ConfigError("", f"{p} holds a {type(tree).__name__}, not a mapping of sections")
    for old, new in upgrade_renamed_keys(tree):
        _log.info("%s: read the saved key %s as %s (renamed since the file was written)", p, old, new)
    return validate(from_dict(QuartetConfig, tree, source=str(p)))


def upgrade_renamed_keys(tree: dict[str, Any]) -> list[tuple[str, str]]:
    """Move every renamed key of the nested `tree` to its new path, in place, with its value mapped;
    the (old, new) paths moved. A value the rename table does not know is left for validation to refuse."""
    moved = []
    for old_path, renamed in RENAMED_KEYS.items():
        *old_sections, old_key = old_path.split(".")
        parent = _section(tree, old_sections, create=False)
        if parent is None or old_key not in parent:
            continue
        value = parent.pop(old_key)
        *new_sections, new_key = renamed.new_path.split(".")
        target = _section(tree, new_sections, create=True)
        assert target is not None  # created on the way
        target[new_key] = renamed.values.get(str(value), value)
        moved.append((old_path, renamed.new_path))
    return moved


def _section(tree: dict[str, Any], names: list[str], create: bool) -> dict[str, Any] | None:
    """The nested mapping at `names` under `tree` (made on the way when `create`); None where it is absent."""
    node: Any = tree
    for name in names:
        if create and name not in node:
            node[name] = {}
        node = node.get(name)
        if not isinstance(node, dict):
            return None
    return node  # type: ignore[no-any-return]


def from_dict(cls: type[T], data: Mapping[str, Any], source: str = "", prefix: str = "") -> T:
    """Build dataclass `cls` from a nested mapping; missing keys keep their defaults."""
    if not isinstance(data, Mapping):
        raise ConfigError(prefix, f"expected a mapping of fields, got {type(data).__name__}", source=source)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if path in RENAMED_KEYS:
            raise _renamed_key(path, value, source)
        if key not in fields:
            raise _unknown_key(path, str(key), list(fields), source)
        kwargs[key] = _convert(value, hints[key], path, source)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.under(prefix, source) from None


def apply_overrides(cfg: QuartetConfig, overrides: Iterable[str]) -> QuartetConfig:
    """Apply `a.b.c=value` overrides in order; the value is parsed as YAML against the field's type."""
    tree = to_dict(cfg)
    for i, item in enumerate(overrides, start=1):
        source = f"override #{i} '{item}'"
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                key or item, "an override must look like key=value", "e.g. actor.optim.lr=1e-5", source
            )
        if key in RENAMED_KEYS:
            raise _renamed_key(key, raw.strip(), source)
        target_type = _field_type(key, source)
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        try:
            value = _parse_override_value(raw, target_type)
        except yaml.YAMLError as err:
            raise ConfigError(
                key,
                f"the value '{raw}' is not valid YAML ({str(err).splitlines()[0]})",
                "quote it, e.g. key='a*b', or write a list as [a, b]",
                source,
            ) from None
        if dataclasses.is_dataclass(target_type) and isinstance(value, Mapping):
            value = _deep_merge(node[leaf], value)  # a section override changes only the keys it names
        node[leaf] = value
        # Build now, so that a bad value is reported with the override that caused it.
        cfg = from_dict(QuartetConfig, tree, source=source)
    return cfg


def to_dict(obj: Any) -> Any:
    """Plain YAML-ready data: enums become their values, tuples become lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def to_yaml(cfg: QuartetConfig) -> str:
    """The resolved config as YAML that `load_config` reads back to an equal object."""
    return dump_yaml(to_dict(cfg))


# ---------------------------------------------------------------------------------------------------------


def _all_paths(cls: type, prefix: str = "") -> list[str]:
    out: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        out.append(path)
        if dataclasses.is_dataclass(hints[f.name]):
            out += _all_paths(hints[f.name], path)
    return out


def _unknown_key(path: str, key: str, known: list[str], source: str) -> ConfigError:
    parent = path.rpartition(".")[0]
    close = [f"{parent}.{k}" if parent else k for k in difflib.get_close_matches(key, known, n=3, cutoff=0.6)]
    # The same leaf name elsewhere in the tree (actor.lr -> actor.optim.lr).
    close += [p for p in _all_paths(QuartetConfig) if p.rsplit(".", 1)[-1] == key and p not in close][:3]
    if close:
        fix = "did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    else:
        fix = f"known keys here: {', '.join(sorted(known))}"
    return ConfigError(path, "unknown config key", fix, source)


def _renamed_key(path: str, value: Any, source: str) -> ConfigError:
    """The error for an old key: its new name, the value mapping, and the line to write instead."""
    renamed = RENAMED_KEYS[path]
    mapping = ", ".join(f"{old} -> {new}" for old, new in renamed.values.items())
    problem = f"renamed to {renamed.new_path}" + (f" ({mapping})" if mapping else "")
    new_value = renamed.values.get(str(value)) if renamed.values else value
    if new_value is None:
        choices = ", ".join(renamed.values.values()) or "its value"
        return ConfigError(path, problem, f"write {renamed.new_path} instead ({choices})", source)
    return ConfigError(path, problem, f"write {renamed.new_path}={new_value}", source)


def _field_type(dotted: str, source: str) -> Any:
    cls: Any = QuartetConfig
    walked = ""
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(
                dotted, f"'{walked}' is a value, not a section", f"override '{walked}' itself", source
            )
        fields = [f.name for f in dataclasses.fields(cls)]
        walked = f"{walked}.{part}" if walked else part
        if part not in fields:
            raise _unknown_key(walked, part, fields, source)
        cls = typing.get_type_hints(cls)[part]
    return cls


def _deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in update.items():
        merged[k] = (
            _deep_merge(merged[k], v) if isinstance(v, Mapping) and isinstance(merged.get(k), Mapping) else v
        )
    return merged


def _parse_override_value(raw: str, tp: Any) -> Any:
    # A string field takes the text verbatim (experiment_name=2024 stays "2024"); null still means None.
    if _strip_optional(tp) is str and raw.strip() not in ("null", "~"):
        return raw
    return parse_scalar(raw)


def _strip_optional(tp: Any) -> Any:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else tp
    return tp


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, path: str, source: str) -> Any:
    """Check and convert one YAML value to the field type `tp`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = _strip_optional(tp)
        if inner is tp:
            raise _wrong(value, path, source, _type_name(tp))
        return _convert(value, inner, path, source)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise _wrong(
                value,
                path,
                source,
                f"a section ({_type_name(tp)})",
                f"give {path} as a mapping of its fields",
            )
        return from_dict(tp, value, source, path)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return _convert_enum(value, tp, path, source)
    if origin is tuple:
        return _convert_tuple(value, args, path, source)
    if tp in (bool, int, float, str):
        return _convert_scalar(value, tp, path, source)
    if tp is Any:
        return value
    raise ConfigError(
        path, f"unsupported field type {_type_name(tp)}", "this is a quartet bug; please report it"
    )


def _wrong(value: Any, path: str, source: str, expected: str, fix: str = "") -> ConfigError:
    """The error for a value of the wrong type at `path`: what was expected, what came, how to fix it."""
    problem = f"expected {expected}, got {type(value).__name__} {value!r}"
    return ConfigError(path, problem, fix or f"set {path} to {expected}", source)


def _convert_enum(value: Any, tp: type[Enum], path: str, source: str) -> Enum:
    """A member of `tp` named by its value or its name, in any case."""
    if isinstance(value, tp):
        return value
    if isinstance(value, str):
        for member in tp:
            if member.value.lower() == value.lower() or member.name.lower() == value.lower():
                return member
    choices = [m.value for m in tp]
    raise ConfigError(path, f"'{value}' is not a valid choice", f"use one of {choices}", source)


def _convert_tuple(value: Any, args: tuple[Any, ...], path: str, source: str) -> tuple[Any, ...]:
    """A YAML list as a tuple: `tuple[X, ...]` of any length, or `tuple[X, Y]` of exactly that many."""
    if not isinstance(value, list | tuple):
        raise _wrong(value, path, source, "a list", f"write it as [a, b] (e.g. {path}=[x,y])")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(v, args[0], f"{path}[{i}]", source) for i, v in enumerate(value))
    if len(value) != len(args):
        raise _wrong(value, path, source, f"a list of {len(args)} values")
    return tuple(
        _convert(v, a, f"{path}[{i}]", source) for i, (v, a) in enumerate(zip(value, args, strict=True))
    )


def _convert_scalar(value: Any, tp: type, path: str, source: str) -> Any:
    """A bool, int, float or str field: exact types, plus the lossless conversions YAML users expect
    (2.0 for an int, "1e-6" or 3 for a float, 42 for a string); never a bool for a number."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _wrong(value, path, source, "true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _wrong(value, path, source, "an integer")
    if tp is float:
        if number:
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise _wrong(value, path, source, "a number")
    if isinstance(value, str):
        return value
    if number:
        return str(value)
    raise _wrong(value, path, source, "a string")
