"""The kernel tests run each Triton kernel on CPU tensors under Triton's interpreter (`TRITON_INTERPRET=1`).

tests/conftest.py sets the variable before anything imports Triton (on machines without CUDA). Here every
test skips, with the reason, when Triton is missing or was imported without the interpreter; and the
kernels' build caches are emptied around each test, so each kernel a test launches is built here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

triton = pytest.importorskip("triton", reason="the `kernels` extra (triton) is not installed")

from quartet.rollout.torch.kernels import rms_norm, rope_cache, sampler  # noqa: E402

_FACTORIES = (rms_norm._kernel, rope_cache._kernel, sampler._kernel)


def _interpreted() -> bool:
    """True when Triton's own language functions were built for the interpreter (kernels run on CPU)."""
    return type(triton.language.standard.sum).__name__ == "InterpretedFunction"


@pytest.fixture(autouse=True)
def triton_interpreter() -> Iterator[None]:
    """Skip unless Triton runs interpreted; build the kernels afresh for the test."""
    if not _interpreted():
        pytest.skip("triton was imported without TRITON_INTERPRET=1 (set by tests/conftest.py without CUDA)")
    for factory in _FACTORIES:
        factory.cache_clear()
    yield
    for factory in _FACTORIES:
        factory.cache_clear()
