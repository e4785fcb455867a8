"""Custom score functions named by `reward.function`: `path/to/file.py:fn` or `package.module:fn`.

The spec, not the function object, is what travels to the scoring workers: each worker process loads it
again with `load_function`, so the function never has to be picklable (a lambda or a closure bound to a
module-level name works). The file is imported in the caller and in every worker: keep its top level free
of side effects (a training script with no `if __name__ == "__main__"` guard is not a reward file).

A file path is told from a module path by its `.py` suffix or a path separator. Relative file paths are
made absolute against the current directory once, in the parent (`resolve_spec`), so workers started
elsewhere load the same file. A file is loaded under a module name derived from its absolute path and
registered in `sys.modules`, so dataclasses and pickling inside it work and two files with the same name
do not collide.

Slow imports: a function may carry a `warm_up()` attribute (a method of a callable object, or an attribute
set on the function); each worker calls it once before its first item, so an import of seconds is not
paid inside the first item's time limit. Module-level imports of the file are loaded before that anyway.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from quartet.core.module_files import load_module_file
from quartet.rewards.scoring import ScoreFn

__all__ = ["PICKLED", "RewardFunctionError", "load_function", "resolve_spec", "split_spec"]

PICKLED = "pickled:"
"""The spec of a function that is not named but sent pickled (cloudpickle) to each scoring worker: the
worker reads the pickle from its input pipe before anything else (`worker.main`)."""


class RewardFunctionError(ValueError):
    """`reward.function` cannot be loaded: missing file or module, import failure, or a missing name."""


def split_spec(spec: str) -> tuple[str, str]:
    """(`path/to/file.py` or `pkg.module`, function name); the last `:` separates them."""
    location, sep, name = spec.rpartition(":")
    if not sep or not location or not name:
        raise RewardFunctionError(
            f"reward.function {spec!r} is not of the form path/to/file.py:function_name or "
            "package.module:function_name"
        )
    return location.strip(), name.strip()


def _is_file(location: str) -> bool:
    return location.endswith(".py") or "/" in location or os.sep in location


def resolve_spec(spec: str) -> str:
    """The spec with a file path made absolute (module paths unchanged): what workers are given."""
    if spec == PICKLED:
        return spec
    location, name = split_spec(spec)
    if _is_file(location):
        location = str(Path(location).expanduser().resolve())
    return f"{location}:{name}"


def _load_file(location: str) -> ModuleType:
    path = Path(location).expanduser().resolve()
    if not path.is_file():
        raise RewardFunctionError(
            f"reward.function: no file {str(path)!r} (from {location!r}, current directory {os.getcwd()!r})"
        )
    try:
        return load_module_file(path, "quartet_reward")
    except Exception as err:
        raise RewardFunctionError(
            f"reward.function: importing {str(path)!r} failed: {type(err).__name__}: {err}"
        ) from err


def _load_module(location: str) -> ModuleType:
    try:
        return importlib.import_module(location)
    except ModuleNotFoundError as err:
        raise RewardFunctionError(
            f"reward.function: no module {location!r} ({err}); a file path needs its .py suffix"
        ) from err
    except Exception as err:
        raise RewardFunctionError(
            f"reward.function: importing module {location!r} failed: {type(err).__name__}: {err}"
        ) from err


def _functions_of(module: ModuleType) -> list[str]:
    """Public functions defined in `module` (not imported into it), for "did you mean" messages."""
    return sorted(
        name
        for name, value in vars(module).items()
        if inspect.isfunction(value) and not name.startswith("_") and value.__module__ == module.__name__
    )


def _check_signature(fn: Any, where: str) -> None:
    """The function must accept verl's four positional arguments."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: accept and let calls tell
        return
    try:
        signature.bind("data_source", "solution_str", "ground_truth", None)
    except TypeError as err:
        raise RewardFunctionError(
            f"reward.function {where} has signature {signature}; it must accept "
            f"(data_source, solution_str, ground_truth, extra_info) positionally ({err})"
        ) from err


def load_function(spec: str) -> ScoreFn:
    """Import the score function named by `spec`; errors name the file or module and its functions."""
    if spec == PICKLED:
        raise RewardFunctionError(
            "a pickled reward function is read from a scoring worker's pipe, not loaded"
        )
    location, name = split_spec(spec)
    module = _load_file(location) if _is_file(location) else _load_module(location)
    where = f"{location!r}"
    fn = getattr(module, name, None)
    if fn is None:
        available = _functions_of(module)
        raise RewardFunctionError(
            f"reward.function: {where} has no function {name!r}; its functions: {available or 'none'}"
        )
    if not callable(fn):
        raise RewardFunctionError(
            f"reward.function: {name!r} in {where} is a {type(fn).__name__}, not a function"
        )
    _check_signature(fn, f"{name!r} in {where}")
    return fn  # type: ignore[no-any-return]
