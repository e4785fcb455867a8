"""The kernel tests run each Triton kernel on CPU tensors under Triton's interpreter (`TRITON_INTERPRET=1`).

tests/conftest.py sets the variable before anything imports Triton (on machines without CUDA or vLLM).
Here every test skips, with the reason, when Triton is missing or was imported without the interpreter; and
the kernels' build caches are emptied around each test, so each kernel a test launches is built here.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest

from quartet.rollout.torch.kernels import rms_norm, rope_cache, sampler

_FACTORIES = (rms_norm._kernel, rope_cache._kernel, sampler._kernel)


def _triton() -> ModuleType | None:
    try:
        return importlib.import_module("triton")
    except ImportError:  # not installed, or a broken install
        return None


def _why_not() -> str | None:
    """Why the kernels cannot run interpreted here, or None when they can."""
    triton = _triton()
    if triton is None:
        return "the `kernels` extra (triton) is not installed"
    if type(triton.language.standard.sum).__name__ != "InterpretedFunction":
        return (
            "triton was imported without TRITON_INTERPRET=1 (tests/conftest.py sets it without CUDA or vLLM)"
        )
    return None


@pytest.fixture(autouse=True)
def triton_interpreter() -> Iterator[None]:
    """Skip unless Triton runs interpreted; build the kernels afresh for the test."""
    reason = _why_not()
    if reason is not None:
        pytest.skip(reason)
    for factory in _FACTORIES:
        factory.cache_clear()
    yield
    for factory in _FACTORIES:
        factory.cache_clear()
