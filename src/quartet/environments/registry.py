"""Environments by name: `@register_environment("name")`, as estimators are with `@register_estimator`.

    @register_environment("countdown")
    class Countdown(Environment): ...

A user module named by `algorithm.custom_module` registers its environments when it is imported: the
driver imports it when the config loads, and every rollout replica imports it before it builds its agent
runner, so a name means the same class everywhere. A name is registered once. An unknown name is an
`UnknownEnvironmentError` that names the closest registered one and lists them all.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

__all__ = [
    "UnknownEnvironmentError",
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
    if not name or not isinstance(name, str):
        raise ValueError(f"an environment name must be a non-empty string, got {name!r}")
    if name in _ENVIRONMENTS:
        owner = getattr(_ENVIRONMENTS[name], "__module__", "?")
        raise ValueError(
            f"environment {name!r} is already registered (by {owner}); register yours under another name"
        )

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


def registered_environments() -> Mapping[str, type]:
    """Every environment class of this process by name (read-only view)."""
    return MappingProxyType(_ENVIRONMENTS)


def known_environments(name: str = "") -> str:
    """'did you mean ...? registered environments: ...' for messages about `name`."""
    close = difflib.get_close_matches(name, list(_ENVIRONMENTS), n=1) if name else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    known = ", ".join(sorted(_ENVIRONMENTS)) or "none"
    return f"{hint}registered environments: {known}"


def check_environment(name: str, where: str) -> None:
    """`UnknownEnvironmentError` unless `name` is registered; `where` names the field that gave it."""
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
