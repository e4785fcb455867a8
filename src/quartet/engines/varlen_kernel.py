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
(gpt-oss): those keep the per-span path, which is exact everywhere. The first call for each kind of input
probes the kernel, forward and backward, against per-span SDPA (`_probe`): a kernel that raises or
differs there, or whose forward raises later, is reported once and not called again in the process; the
per-span path answers instead.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import torch
import torch.nn.functional as F

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
    heads = (query.shape[1], key.shape[1], query.shape[-1])
    doubt = _probe(name, dtype, query.device, heads, layout.left, scaling)
    if doubt is not None:
        _give_up(doubt)
        return None
    q, k, v = (t[0].transpose(0, 1).to(dtype) for t in (query, key, value))
    try:
        out = call(q, k, v, layout)
    except _KERNEL_ERRORS as err:
        _give_up(f"{name}'s varlen kernel failed: {type(err).__name__}: {err}")
        return None
    _state.calls += 1
    return out.unsqueeze(0)


def _give_up(reason: str) -> None:
    """No kernel from now on in this process, said once."""
    _state.off = reason
    log.warning("%s; packed attention runs span by span from now on", reason)


_KERNEL_ERRORS = (RuntimeError, TypeError, ValueError, NotImplementedError)

_PROBE_TOLERANCE = 5e-2
"""Largest difference from SDPA a probe accepts, relative to the largest value (bf16 is ~1e-2 off)."""


@lru_cache(maxsize=32)
def _probe(
    name: str,
    dtype: torch.dtype,
    device: torch.device,
    heads: tuple[int, int, int],
    left: int,
    scale: float | None,
) -> str | None:
    """Why kernel `name` is not to be trusted with inputs like these (None: it is), once per kind of input:
    its forward and backward on two small spans (the second with more keys than queries, as a response after
    its prompt) against per-span SDPA in the same dtype. A kernel that raises in its backward would
    otherwise fail the update, past the forward's fallback."""
    hq, hkv, dim = heads
    g = torch.Generator().manual_seed(0)
    q_lengths, k_lengths = (3, 4), (3, 6)
    sizes = ((sum(q_lengths), hq), (sum(k_lengths), hkv), (sum(k_lengths), hkv))
    q, k, v = (torch.randn(n, h, dim, generator=g) for n, h in sizes)
    upstream = torch.randn(sum(q_lengths), hq, dim, generator=g)
    layout = _Layout(_offsets(q_lengths, device), _offsets(k_lengths, device), 4, 6, scale, left)
    call = _torch_call if name == "torch" else _flash_attn_call
    with torch.enable_grad(), torch.autocast(device.type, enabled=False):
        try:
            got = _output_and_grads(lambda a, b, c: call(a, b, c, layout), (q, k, v), upstream, dtype, device)
        except _KERNEL_ERRORS as err:
            return f"{name}'s varlen kernel failed a probe: {type(err).__name__}: {err}"
        want = _output_and_grads(
            lambda a, b, c: _per_span_sdpa(a, b, c, q_lengths, k_lengths, scale, left),
            (q, k, v),
            upstream,
            dtype,
            device,
        )
    worst = max(
        float((a - b).abs().max() / b.abs().max().clamp_min(1e-6)) for a, b in zip(got, want, strict=True)
    )
    if worst > _PROBE_TOLERANCE:
        return f"{name}'s varlen kernel differs from SDPA by {worst:.3g} (relative) in a probe"
    return None


def _output_and_grads(
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    qkv: tuple[torch.Tensor, ...],
    upstream: torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """attend(q, k, v) and the gradients of q, k, v for `upstream`, in float32 on the CPU."""
    leaves = [t.to(device, dtype).requires_grad_() for t in qkv]
    out = attend(*leaves)
    grads = torch.autograd.grad(out, leaves, upstream.to(device, out.dtype))
    return [x.detach().float().cpu() for x in (out, *grads)]


def _per_span_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_lengths: tuple[int, ...],
    k_lengths: tuple[int, ...],
    scale: float | None,
    left: int,
) -> torch.Tensor:
    """[T_q, H, D]: each span by SDPA with a mask, causal aligned to the end of its keys, the window's
    `left` keys back (-1: all)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    outs = []
    spans = zip(
        torch.split(q, list(q_lengths)),
        torch.split(k, list(k_lengths)),
        torch.split(v, list(k_lengths)),
        strict=True,
    )
    for qs, ks, vs in spans:
        n, m = qs.shape[0], ks.shape[0]
        at = torch.arange(m - n, m, device=q.device)[:, None]
        key_at = torch.arange(m, device=q.device)[None, :]
        sees = key_at <= at
        if left >= 0:
            sees &= key_at >= at - left
        outs.append(
            F.scaled_dot_product_attention(
                qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1), attn_mask=sees, scale=scale
            ).transpose(0, 1)
        )
    return torch.cat(outs)


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


@lru_cache(maxsize=1)
def _torch_varlen() -> Callable[..., Any] | None:
    """torch's `varlen_attn`, looked up once (this runs for every packed layer)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@lru_cache(maxsize=1)
def _flash_attn_varlen() -> Callable[..., Any] | None:
    """flash-attn's varlen function, looked up once: a failed import is not remembered by Python, and
    would search the path again at every layer."""
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
