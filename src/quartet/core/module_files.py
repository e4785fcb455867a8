"""Importing a user's `.py` file as a module, once per process: the loader behind `reward.function` and
`algorithm.custom_module`. Callers wrap the errors in their own messages (which config field, which fix)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["load_module_file"]


def load_module_file(path: Path, prefix: str) -> ModuleType:
    """Import the file `path` under a name unique to it (`<prefix>_<stem>_<hash of the path>`), or return the
    module already imported from it. Raises ImportError when the file cannot be loaded as a module, and
    whatever executing it raises (the half-imported module is forgotten)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"{prefix}_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{str(path)!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
