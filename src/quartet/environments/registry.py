"""Environments by name: `@register_environment("name")`, as estimators are with `@register_estimator`.

    @register_environment("countdown")
    class Countdown(Environment): ...

A user module named by `algorithm.custom_module` registers its environments when it is imported: the
driver imports it when the config loads, and every rollout replica imports it before it builds its agent
runner, so a name means the same class everywhere. An installed package can offer environments without
any config: an entry point in the group `quartet.environments` (`name = "package.module:Class"` in its
pyproject's `[project.entry-points."quartet.environments"]`) is loaded the first time a name is not found
among the registered ones. A name is registered once. An unknown name is an `UnknownEnvironmentError`
that names the closest registered one and lists them all (installed entry points included).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from quartet.core.registry import check_unclaimed

__all__ = [
    "UnknownEnvironmentError",
    "ENTRY_POINT_GROUP",
    "check_environment",
    "known_environments",
    "make_environment",
    "register_environment",
    "registered_environments",
]

T = TypeVar("T", bound=type)

_ENVIRONMENTS: dict[str, type] = {}


class UnknownEnvironmentError(ValueError):
    """No environment is registered under a name; the message lists those that are."""


def register_environment(name: str) -> Callable[[T], T]:
    """Class decorator: make the class (an `Environment`, or any class with async or plain `reset(row)`
    and `step(turn)`) the environment `name`. The built-ins' and other modules' names are taken."""
    check_unclaimed(name, _ENVIRONMENTS, "environment")

    def decorate(cls: T) -> T:
        if not inspect.isclass(cls):
            raise TypeError(f"@register_environment({name!r}) decorates a class, got {cls!r}")
        missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
        if missing:
            raise TypeError(
                f"environment {name!r} ({cls.__qualname__}) has no {' or '.join(missing)} method: an "
                "environment defines reset(row) and step(turn) (quartet.environments.base.Environment)"
            )
        setattr(cls, "name", name)  # noqa: B010 (T is any class)
        _ENVIRONMENTS[name] = cls
        return cls

    return decorate


ENTRY_POINT_GROUP = "quartet.environments"


def _load_entry_point(name: str) -> None:
    """Register environment `name` from an installed package's entry point, if one offers it; an entry
    point that fails to load is an error naming it (never a silent miss)."""
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
        try:
            cls = point.load()
        except Exception as err:
            raise UnknownEnvironmentError(
                f"environment {name!r}: the installed entry point {point.value!r} "
                f"(group {ENTRY_POINT_GROUP}) failed to load: {type(err).__name__}: {err}"
            ) from err
        if name not in _ENVIRONMENTS:  # the module may have registered it with the decorator already
            register_environment(name)(cls)
        return


def _entry_point_names() -> list[str]:
    return sorted({p.name for p in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})


def registered_environments() -> Mapping[str, type]:
    """Every environment class of this process by name (read-only view)."""
    return MappingProxyType(_ENVIRONMENTS)


def known_environments(name: str = "") -> str:
    """'did you mean ...? registered environments: ...' for messages about `name`."""
    names = sorted(set(_ENVIRONMENTS) | set(_entry_point_names()))
    close = difflib.get_close_matches(name, names, n=1) if name else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    known = ", ".join(names) or "none"
    return f"{hint}registered environments: {known}"


def check_environment(name: str, where: str) -> None:
    """`UnknownEnvironmentError` unless `name` is registered (or an installed entry point offers it,
    which this loads); `where` names the field that gave it."""
    if name not in _ENVIRONMENTS:
        _load_entry_point(name)
    if name not in _ENVIRONMENTS:
        raise UnknownEnvironmentError(
            f"{where}: unknown environment {name!r}; {known_environments(name)}. Fix: correct the name, or "
            "register the class with @register_environment in the module named by algorithm.custom_module"
        )


def make_environment(name: str, kwargs: Mapping[str, Any], where: str) -> Any:
    """A new instance of environment `name` built with `kwargs` (one per episode); an unknown name is an
    `UnknownEnvironmentError`, a constructor that refuses the arguments a TypeError naming `where`."""
    check_environment(name, where)
    cls = _ENVIRONMENTS[name]
    try:
        return cls(**dict(kwargs))
    except TypeError as err:
        raise TypeError(
            f"environment {name!r} ({cls.__qualname__}) refused its arguments {sorted(kwargs)} from {where}: "
            f"{err}"
        ) from err
