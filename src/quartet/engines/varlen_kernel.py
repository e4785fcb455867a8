"""Packed attention in one kernel call per layer on CUDA: flash attention over cumulative sequence lengths.

The packed passes (`engines.packing`, `engines.shared_prompts`) attend within spans: each packed row, or a
shared prompt and each of its responses. Without a varlen kernel that is one `scaled_dot_product_attention`
call per span and layer: on a GPU, 16 rows x 28 layers are 448 small launches a forward. A varlen kernel
takes the whole micro-batch in one call: the queries and keys laid out span after span, with `cu_seq_q` and
`cu_seq_k` (cumulative lengths) marking where each span starts. Causal attention is aligned to the end of a
span's keys, so a response's queries (the last of its keys, after its prompt's) see the whole prompt and
the response before them, as in its own row.

Two kernels are taken, in this order:
- torch's own `torch.nn.attention.varlen.varlen_attn` (flash attention), where this torch has it. Its
  earlier releases take neither a scale, a window nor fewer key/value heads: the query is scaled, key/value
  heads repeated, and a sliding window left to the per-span path.
- flash-attn's `flash_attn_varlen_func`, where it is installed.

Under autocast (float32 master weights, bf16 compute: the training engine's default) the inputs are cast
to autocast's dtype, as autocast casts SDPA's; autocast leaves a custom kernel's inputs alone, and rotary
embeddings hand over float32 queries and keys. Neither kernel runs on CPU, in float32 without autocast,
with values narrower than the queries (MLA), a head dim flash attention does not take, or sink logits
(gpt-oss): those keep the per-span path, which is exact everywhere. A kernel that raises is reported once
and not called again in the process; the per-span path answers instead.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import torch

__all__ = [
    "kernel_attention",
    "set_varlen_kernel",
    "varlen_kernel_calls",
    "varlen_kernel_name",
    "varlen_kernel_off",
]

log = logging.getLogger(__name__)

_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 256


@dataclass
class _KernelState:
    off: str | None = None
    """Why the kernels are not used in this process (None: they are used where they run)."""
    calls: int = 0
    """Kernel calls that answered, in this process."""


_state = _KernelState()


def set_varlen_kernel(enabled: bool) -> None:
    """Use the varlen kernels (the default) or the per-span path everywhere: for comparisons of the two."""
    _state.off = None if enabled else "turned off by set_varlen_kernel(False)"


def varlen_kernel_off() -> str | None:
    """Why no varlen kernel runs in this process (a failed call, or `set_varlen_kernel(False)`); None: on."""
    return _state.off


def varlen_kernel_calls() -> int:
    """How many varlen kernel calls answered in this process (one per packed layer and micro-batch)."""
    return _state.calls


def varlen_kernel_name(query: torch.Tensor, value: torch.Tensor, window: int | None = None) -> str | None:
    """The kernel `kernel_attention` would call for these inputs: `torch` or `flash_attn`; None: per span."""
    if _state.off is not None or _kernel_dtype(query) is None:
        return None
    d = query.shape[-1]
    if d != value.shape[-1] or d % 8 or d > _MAX_HEAD_DIM:
        return None
    if _torch_varlen() is not None and (window is None or _takes("window_size")):
        return "torch"
    return "flash_attn" if _flash_attn_varlen() is not None else None


def kernel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    query_lengths: tuple[int, ...],
    key_lengths: tuple[int, ...],
    window: int | None = None,
) -> torch.Tensor | None:
    """Causal attention of each span in one kernel call, or None where no kernel takes these inputs.

    query [1, Hq, N, D] (span after span, `query_lengths`), key and value [1, Hkv, M, D] (span after span,
    `key_lengths`; a span's queries are its last keys) -> [1, N, Hq, D]. `window`: a query sees the keys of
    the last `window` positions, its own included."""
    name = varlen_kernel_name(query, value, window)
    if name is None:
        return None
    kept = [i for i, n in enumerate(query_lengths) if n]  # a row with no token is no span
    q_lengths = tuple(query_lengths[i] for i in kept)
    k_lengths = tuple(key_lengths[i] for i in kept)
    call = _torch_call if name == "torch" else _flash_attn_call
    layout = _Layout(
        _offsets(q_lengths, query.device),
        _offsets(k_lengths, query.device),
        max(q_lengths),
        max(k_lengths),
        scaling,
        -1 if window is None else window - 1,
    )
    dtype = _kernel_dtype(query) or query.dtype
    q, k, v = (t[0].transpose(0, 1).to(dtype) for t in (query, key, value))
    try:
        out = call(q, k, v, layout)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as err:
        _state.off = f"{name}'s varlen kernel failed: {type(err).__name__}: {err}"
        log.warning("%s; packed attention runs span by span from now on", _state.off)
        return None
    _state.calls += 1
    return out.unsqueeze(0)


def _kernel_dtype(query: torch.Tensor) -> torch.dtype | None:
    """The half dtype a flash kernel would run these inputs in; None off CUDA."""
    return _half_dtype(query) if query.is_cuda else None


def _half_dtype(query: torch.Tensor) -> torch.dtype | None:
    """fp16 or bf16 attention runs in here: autocast's where it is on (SDPA would be cast to it), else the
    inputs' own; None: float32."""
    kind = query.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else query.dtype
    return dtype if dtype in _FLASH_DTYPES else None


@lru_cache(maxsize=16)
def _offsets(lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """[len + 1] int32 cumulative lengths on `device`, once per micro-batch (not a copy per layer)."""
    ends = [0]
    for n in lengths:
        ends.append(ends[-1] + n)
    return torch.tensor(ends, dtype=torch.int32, device=device)


def _torch_varlen() -> Callable[..., Any] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _flash_attn_varlen() -> Callable[..., Any] | None:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return cast("Callable[..., Any]", flash_attn_varlen_func)


@lru_cache(maxsize=8)
def _takes(name: str) -> bool:
    """Whether torch's `varlen_attn` has the keyword `name` (its first releases lack most)."""
    fn = _torch_varlen()
    return fn is not None and name in inspect.signature(fn).parameters


@dataclass(frozen=True)
class _Layout:
    """Where the spans are, for a kernel: cumulative lengths on the device, the longest span, the scale and
    the window's left reach (-1: none)."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    scale: float | None
    left: int


def _torch_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, at: _Layout) -> torch.Tensor:
    fn = _torch_varlen()
    assert fn is not None
    kwargs: dict[str, Any] = {}
    if _takes("window_size"):
        kwargs["window_size"] = (at.left, 0)  # (-1, 0): causal, aligned to the end of the keys
    else:
        kwargs["is_causal"] = True
    grouped = q.shape[1] != k.shape[1]
    if grouped and _takes("enable_gqa"):
        kwargs["enable_gqa"] = True
    elif grouped:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if _takes("scale"):
        kwargs["scale"] = at.scale
    elif at.scale is not None:  # the kernel scales by 1 / sqrt(D)
        q = q * (at.scale * q.shape[-1] ** 0.5)
    out = fn(q, k, v, at.cu_q, at.cu_k, at.max_q, at.max_k, **kwargs)
    attended: torch.Tensor = out[0] if isinstance(out, tuple) else out
    return attended


def _flash_attn_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, at: _Layout) -> torch.Tensor:
    fn = _flash_attn_varlen()
    assert fn is not None
    attended: torch.Tensor = fn(
        q, k, v, at.cu_q, at.cu_k, at.max_q, at.max_k, softmax_scale=at.scale, causal=True,
        window_size=(at.left, 0),
    )  # fmt: skip
    return attended
