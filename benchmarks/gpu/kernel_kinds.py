"""Device time of a profiled region by kind of kernel: what an update spends on matmuls, attention, norms,
elementwise work, the optimizer and copies, so the next fix goes where the time is (issue 54, item 3).

A kernel's kind is read from its name: CUDA kernel names (cuBLAS/CUTLASS gemms, flash attention, Triton's
fused kernels, PyTorch's elementwise and reduce templates) on a GPU, aten op names in a CPU dry run. The
rules are ordered (the first that matches wins) and a name no rule knows counts as `other`, listed by name
so a new kind is visible rather than lost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = ["KIND_RULES", "by_kind", "kind_of"]

_ATEN_MATMUL = "mm|addmm|bmm|matmul|linear|baddbmm"
_ATEN_COPY = "copy_|cat|clone|contiguous|to|_to_copy|fill_|zero_"
_ATEN_REDUCE = "sum|mean|max|min|amax|norm|linalg_vector_norm|argmax"
_ATEN_ELEMENTWISE = (
    "mul|add|sub|div|silu|gelu|exp|neg|pow|sqrt|where|sigmoid|clamp|mul_|add_|div_|silu_backward|threshold"
)

KIND_RULES: tuple[tuple[str, str], ...] = (
    # (kind, regular expression over the lower-cased name)
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot_product"),
    ("optimizer", r"adam|multi_tensor_apply|_foreach_|lerp|addcdiv|addcmul|fused_sgd"),
    ("matmul", rf"gemm|cutlass|cublas|sm90_xmma|sm80_xmma|ampere_|hopper_|nvjet|aten::({_ATEN_MATMUL})\b"),
    ("norm", r"rms_?norm|layer_?norm|rsqrt|aten::native_layer_norm\b"),
    ("softmax_logprob", r"softmax|log_softmax|logsumexp|cross_entropy|nll_loss"),
    ("copy", rf"memcpy|memset|copy|cat_|catarray|aten::({_ATEN_COPY})\b"),
    ("reduce", rf"reduce|aten::({_ATEN_REDUCE})\b"),
    ("elementwise", rf"elementwise|vectorized|unrolled|triton_|aten::({_ATEN_ELEMENTWISE})\b"),
)
_COMPILED = tuple((kind, re.compile(pattern)) for kind, pattern in KIND_RULES)


def kind_of(name: str) -> str:
    """The kind of one kernel or op name (`other` when no rule matches)."""
    low = name.lower()
    for kind, pattern in _COMPILED:
        if pattern.search(low):
            return kind
    return "other"


def by_kind(rows: Iterable[tuple[str, float, int]], top_other: int = 8) -> dict[str, Any]:
    """(name, self time in us, calls) rows -> {"kinds": {kind: {"us", "share", "calls"}}, "total_us",
    "other_names": the largest unmatched names}; shares sum to 1 over the kinds present."""
    kinds: dict[str, dict[str, float]] = {}
    others: list[tuple[float, str]] = []
    for name, us, calls in rows:
        kind = kind_of(name)
        entry = kinds.setdefault(kind, {"us": 0.0, "calls": 0})
        entry["us"] += us
        entry["calls"] += calls
        if kind == "other":
            others.append((us, name[:90]))
    total = sum(e["us"] for e in kinds.values())
    for entry in kinds.values():
        entry["share"] = round(entry["us"] / total, 4) if total else 0.0
        entry["us"] = round(entry["us"], 1)
    ordered = dict(sorted(kinds.items(), key=lambda kv: -kv[1]["us"]))
    others.sort(reverse=True)
    return {"total_us": round(total, 1), "kinds": ordered, "other_names": [n for _, n in others[:top_other]]}
