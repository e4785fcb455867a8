"""The device step that times the kernels (benchmarks/gpu/goal_decode_kernels.py) builds cases whose Triton
and torch sides agree: here on the CPU at small shapes, the kernels under Triton's interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from quartet.rollout.torch.kernels import sampler

KIT = str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu")
sys.path.insert(0, KIT)  # the kit's scripts import each other by name, as when one runs; only for this import
try:
    from goal_decode_kernels import compare, kernel_cases
finally:
    sys.path.remove(KIT)


def test_every_timed_case_compares_two_agreeing_sides() -> None:
    cases = kernel_cases(3, torch.device("cpu"), shape=(64, 4, 2, 64), vocab=120)
    assert set(cases) == {"add_rms_norm", "rope_cache", "sample", "sample_top_k_top_p"}
    for name, (fused, reference) in cases.items():
        agreement = compare(fused(), reference())
        if name.startswith("sample"):
            # seeded inputs, none drawn within float32 rounding of a boundary: every token equal
            assert agreement["tokens_equal"] == 1.0, (name, agreement)
            assert agreement["logprob_max_diff"] < 1e-4, (name, agreement)
        else:  # bf16, interpreted (truncating) against rounding: a few units of 2**-7 of values up to ~10
            assert agreement["max_abs_diff"] < 0.2, (name, agreement)
    assert sampler.RANKED_KERNEL is False  # the timed filtered case calls the kernel itself (sample_triton)
