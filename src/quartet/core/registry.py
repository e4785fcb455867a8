"""User-registered advantage estimators and policy losses, and the user module that registers them.

A user adds an algorithm without editing quartet: a module (a file `path/to/my_algo.py` or a dotted module
name) defines functions under these decorators, and the config names the module and the function:

    # my_algo.py
    from quartet.core.advantages import AdvantageInputs, AdvantageOutput, AdvantageParams
    from quartet.core.registry import register_estimator

    @register_estimator("my_est", needs_group=True)
    def my_est(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput: ...

    # config: algorithm.custom_module=path/to/my_algo.py  algorithm.adv_estimator=my_est

Contracts (the same as the built-ins'):
- estimator: `fn(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput`, advantages and
  returns [B, T], 0 on masked tokens; run under `torch.no_grad` on the driver. Registered estimators are
  critic-free (no `values` are computed for them); `needs_group=True` makes the config require
  `rollout.n >= 2`.
- policy loss: `fn(logprob, old_logprob, advantages, response_mask, clip) -> TokenLosses`, all [B, T]
  (`clip` is the actor's `ClipParams`); `compute_policy_loss` applies TIS and `actor.loss_agg_mode` to the
  per-token losses, as for PPO. It runs in the actor's processes: every process that computes losses
  imports the module (`import_custom_module`) before its first step.

Why a registry of names here, when the built-ins are enums: the built-ins stay typed members of
`choices`; only names a user module registers are looked up by string, and the config checks them (after
importing the module, on the driver) so a typo fails before any worker starts, naming the built-in and the
registered names. A registered name may not shadow a built-in one.

The module is imported once per process (a second `import_custom_module` of the same module is a no-op). A
file is loaded under a module name derived from its absolute path and kept in `sys.modules`, so the
functions pickle and two files with the same name do not collide; relative paths are resolved against the
current directory (`resolve_module_spec`, done once on the driver so that workers started elsewhere load
the same file).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, TypeVar

from quartet.core.choices import AdvantageEstimator, PolicyLoss
from quartet.core.contracts import AdvantageInputs, AdvantageOutput, AdvantageParams, ClipParams, TokenLosses
from quartet.core.module_files import load_module_file

__all__ = [
    "CUSTOM_MODULES_ENV",
    "CustomModuleError",
    "RegisteredEstimator",
    "check_unclaimed",
    "estimator_names",
    "get_estimator",
    "get_policy_loss",
    "import_custom_module",
    "policy_loss_names",
    "register_estimator",
    "register_policy_loss",
    "registered_estimators",
    "registered_policy_losses",
    "resolve_module_spec",
]

EstimatorFn = Callable[["AdvantageInputs", "AdvantageParams"], "AdvantageOutput"]
"""A registered estimator: (inputs, params) -> AdvantageOutput."""

PolicyLossFn = Callable[
    ["torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor", "ClipParams | None"], "TokenLosses"
]
"""A registered policy loss: (logprob, old_logprob, advantages, response_mask, clip) -> TokenLosses."""

F = TypeVar("F", bound=Callable[..., object])

CUSTOM_MODULES_ENV = "QUARTET_CUSTOM_MODULES"
"""Environment variable listing (os.pathsep-separated) the user modules this process imported, so child
processes it starts (the reward scoring workers) import them too (`quartet.rewards.registry`)."""


class CustomModuleError(ImportError):
    """`algorithm.custom_module` cannot be found or imported, or registers a name twice."""


@dataclass(frozen=True)
class RegisteredEstimator:
    """A user estimator and what the config must know about it."""

    name: str
    fn: EstimatorFn
    needs_group: bool = False
    """Compares the samples of one prompt (the config then requires rollout.n >= 2)."""


_ESTIMATORS: dict[str, RegisteredEstimator] = {}
_POLICY_LOSSES: dict[str, PolicyLossFn] = {}
_IMPORTED: dict[str, ModuleType] = {}


def _check_new(name: str, builtin: list[str], registered: Mapping[str, object], what: str) -> None:
    if not name or not isinstance(name, str):
        raise ValueError(f"a {what} name must be a non-empty string, got {name!r}")
    if name in builtin:
        raise ValueError(f"{what} {name!r} is built in; register the custom one under another name")
    if name in registered:
        raise ValueError(f"{what} {name!r} is already registered (two modules, or one imported twice?)")


def check_unclaimed(name: str, registered: Mapping[str, object], what: str) -> None:
    """ValueError unless `name` is a non-empty string no entry of `registered` holds; a taken name is
    reported with the module that registered it (the agent loop and environment registries)."""
    if not name or not isinstance(name, str):
        raise ValueError(f"an {what} name must be a non-empty string, got {name!r}")
    if name in registered:
        owner = getattr(registered[name], "__module__", "?")
        raise ValueError(
            f"{what} {name!r} is already registered (by {owner}); register yours under another name"
        )


def register_estimator(name: str, *, needs_group: bool = False) -> Callable[[F], F]:
    """Decorator: make `fn(inputs, params) -> AdvantageOutput` the estimator of `adv_estimator=name`."""
    _check_new(name, [e.value for e in AdvantageEstimator], _ESTIMATORS, "advantage estimator")

    def decorate(fn: F) -> F:
        _ESTIMATORS[name] = RegisteredEstimator(name, fn, needs_group)  # type: ignore[arg-type]
        return fn

    return decorate


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Decorator: make `fn(logprob, old_logprob, advantages, mask, clip) -> TokenLosses` the policy loss
    `actor.policy_loss=name`."""
    _check_new(name, [p.value for p in PolicyLoss], _POLICY_LOSSES, "policy loss")

    def decorate(fn: F) -> F:
        _POLICY_LOSSES[name] = fn  # type: ignore[assignment]
        return fn

    return decorate


def registered_estimators() -> Mapping[str, RegisteredEstimator]:
    """The estimators registered in this process (read-only view)."""
    return MappingProxyType(_ESTIMATORS)


def registered_policy_losses() -> Mapping[str, PolicyLossFn]:
    """The policy losses registered in this process (read-only view)."""
    return MappingProxyType(_POLICY_LOSSES)


def estimator_names() -> tuple[list[str], list[str]]:
    """(built-in, registered) estimator names, for error messages."""
    return [e.value for e in AdvantageEstimator], sorted(_ESTIMATORS)


def policy_loss_names() -> tuple[list[str], list[str]]:
    """(built-in, registered) policy loss names, for error messages."""
    return [p.value for p in PolicyLoss], sorted(_POLICY_LOSSES)


def _unknown(what: str, name: str, names: tuple[list[str], list[str]], key: str) -> KeyError:
    builtin, registered = names
    return KeyError(
        f"unknown {what} {name!r}; built in: {builtin}; registered: {registered or 'none'}. Fix: use one of "
        f"those, or register it with @register_{key} in a module named by algorithm.custom_module"
    )


def get_estimator(name: str) -> RegisteredEstimator:
    """The registered estimator `name`; KeyError naming the built-in and registered names otherwise."""
    if name not in _ESTIMATORS:
        raise _unknown("advantage estimator", name, estimator_names(), "estimator")
    return _ESTIMATORS[name]


def get_policy_loss(name: str) -> PolicyLossFn:
    """The registered policy loss `name`; KeyError naming the built-in and registered names otherwise."""
    if name not in _POLICY_LOSSES:
        raise _unknown("policy loss", name, policy_loss_names(), "policy_loss")
    return _POLICY_LOSSES[name]


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def resolve_module_spec(spec: str) -> str:
    """A file path made absolute (against the current directory); a dotted module name unchanged."""
    spec = spec.strip()
    return str(Path(spec).expanduser().resolve()) if spec and _is_file(spec) else spec


def import_custom_module(spec: str) -> ModuleType | None:
    """Import the user module `spec` (file path or dotted name) once in this process; None for "".

    Raises CustomModuleError naming the module and the cause (missing file, import error inside it).
    """
    spec = resolve_module_spec(spec)
    if not spec:
        return None
    if spec in _IMPORTED:
        return _IMPORTED[spec]
    try:
        module = _import_file(spec) if _is_file(spec) else importlib.import_module(spec)
    except CustomModuleError:
        raise
    except Exception as exc:  # the user's code: report any failure with the module's name
        raise CustomModuleError(
            f"algorithm.custom_module {spec!r} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    _IMPORTED[spec] = module
    listed = [m for m in os.environ.get(CUSTOM_MODULES_ENV, "").split(os.pathsep) if m]
    if spec not in listed:
        os.environ[CUSTOM_MODULES_ENV] = os.pathsep.join([*listed, spec])
    return module


def _import_file(path: str) -> ModuleType:
    if not Path(path).is_file():
        raise CustomModuleError(
            f"algorithm.custom_module {path!r}: no such file. Fix: give a path to a .py file (relative to "
            "the directory quartet is started from) or a dotted module name on PYTHONPATH"
        )
    try:
        return load_module_file(Path(path), "quartet_custom")
    except ImportError as exc:
        raise CustomModuleError(f"algorithm.custom_module {path!r}: {exc}") from exc


if TYPE_CHECKING:
    import torch
