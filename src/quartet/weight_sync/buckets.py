"""Packing named tensors into flat byte buckets, and unpacking them bitwise.

Why buckets: one collective per tensor costs a round of latency per tensor (a 7B model has ~300 of them,
many tiny norms and biases), while one collective for the whole model needs a second copy of the model in
memory. Consecutive tensors are therefore packed into flat uint8 buffers of at most `bucket_bytes` and each
buffer travels as one broadcast; the stream is consumed lazily, so the sender holds at most the bucket being
packed plus the one in flight.

Why raw bytes: each tensor is reinterpreted with `Tensor.view(torch.uint8)`, never converted, so every dtype
(bfloat16 and the float8 types included, which numpy cannot represent) and every bit pattern (NaN payloads,
negative zero) arrives unchanged. Offsets inside a bucket are aligned to `ALIGN_BYTES` so that the receiver
can view each slice back as its dtype without a copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

__all__ = [
    "ALIGN_BYTES",
    "DEFAULT_BUCKET_BYTES",
    "Bucket",
    "TensorMeta",
    "iter_buckets",
    "pack_bucket",
    "plan_buckets",
    "tensor_bytes",
    "unpack_bucket",
]

DEFAULT_BUCKET_BYTES = 256 * 2**20
"""Large enough that per-broadcast latency is negligible, small enough to stay a minor memory overhead."""

ALIGN_BYTES = 64
"""Every tensor starts at a multiple of this (>= the largest element size, and a cache line)."""

T = TypeVar("T")


def _align_up(offset: int) -> int:
    return -(-offset // ALIGN_BYTES) * ALIGN_BYTES


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor lies in a bucket and how to view its bytes back."""

    name: str
    """The tensor's name as the sender gave it (for models: the parameter name)."""

    dtype: torch.dtype
    """Element type, restored exactly."""

    shape: tuple[int, ...]
    """Shape; `()` for a 0-d tensor."""

    offset: int
    """First byte in the bucket buffer; a multiple of `ALIGN_BYTES`."""

    nbytes: int
    """Number of bytes: numel times element size (0 for an empty tensor)."""

    def to_wire(self) -> list[Any]:
        """A JSON-ready list: [name, dtype, shape, offset, nbytes] (compact for buckets of many tensors)."""
        return [self.name, str(self.dtype).removeprefix("torch."), list(self.shape), self.offset, self.nbytes]

    @classmethod
    def from_wire(cls, item: list[Any]) -> TensorMeta:
        """Parse `to_wire`'s list; rejects unknown dtypes and sizes that disagree with the shape."""
        name, dtype_name, shape, offset, nbytes = item
        dtype = getattr(torch, str(dtype_name), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"tensor '{name}': unknown dtype '{dtype_name}' in bucket metadata")
        meta = cls(str(name), dtype, tuple(int(d) for d in shape), int(offset), int(nbytes))
        expected = math.prod(meta.shape) * dtype.itemsize
        if expected != meta.nbytes or meta.offset % ALIGN_BYTES:
            raise ValueError(
                f"tensor '{name}': metadata says {meta.nbytes} bytes at offset {meta.offset}, but shape "
                f"{meta.shape} of {dtype} needs {expected} bytes at a multiple of {ALIGN_BYTES}"
            )
        return meta


@dataclass(frozen=True)
class Bucket:
    """Consecutive tensors packed into one flat buffer, with what is needed to unpack them."""

    metas: tuple[TensorMeta, ...]
    """One entry per tensor, in stream order."""

    buffer: torch.Tensor
    """1-D uint8; its length is the end of the last tensor (gaps between tensors are zero)."""

    @property
    def nbytes(self) -> int:
        """Bytes on the wire for this bucket's payload (tensor bytes plus alignment gaps)."""
        return int(self.buffer.numel())


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a contiguous 1-D uint8 tensor (a view when the tensor is already contiguous).

    `reshape(-1)` first, because `view(dtype)` refuses 0-d tensors whose element size differs from one byte;
    conjugate and negative bits are resolved so the bytes are the values the tensor shows.
    """
    flat = tensor.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat.view(torch.uint8)


def _check_tensor(name: str, tensor: object) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"'{name}' is a {type(tensor).__name__}, not a torch.Tensor")
    if hasattr(tensor, "full_tensor"):  # a DTensor: its local bytes are a shard, not the weight
        raise TypeError(f"'{name}' is a DTensor; send tensor.full_tensor() (or a gathered state dict)")
    if tensor.layout != torch.strided or tensor.is_meta:
        raise TypeError(f"'{name}' has layout {tensor.layout} on {tensor.device}; only dense data can travel")
    return tensor


def plan_buckets(items: Iterable[tuple[T, int]], bucket_bytes: int) -> Iterator[list[tuple[T, int]]]:
    """Group consecutive `(item, nbytes)` pairs into buckets; yields `[(item, offset), ...]` per bucket.

    A bucket's end (offset + nbytes of its last item) never exceeds `bucket_bytes`, except for an item
    larger than the cap, which travels alone. Offsets are aligned to `ALIGN_BYTES`. The input is consumed
    lazily: an item is held only until its bucket is yielded.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    group: list[tuple[T, int]] = []
    end = 0
    for item, nbytes in items:
        offset = _align_up(end) if group else 0
        if group and offset + nbytes > bucket_bytes:
            yield group
            group, offset = [], 0
        group.append((item, offset))
        end = offset + nbytes
    if group:
        yield group


Allocate = Callable[[int], torch.Tensor]
"""Makes a bucket's 1-D uint8 buffer of the given size (e.g. in memory another process can map)."""


def pack_bucket(
    placed: Sequence[tuple[tuple[str, torch.Tensor], int]],
    device: torch.device | str = "cpu",
    allocate: Allocate | None = None,
) -> Bucket:
    """Copy each placed `((name, tensor), offset)` (as `plan_buckets` yields them) into one new buffer,
    made by `allocate(nbytes)` when given, else a plain tensor on `device`."""
    if not placed:
        raise ValueError("a bucket needs at least one tensor")
    sources = [(name, tensor_bytes(tensor), tensor, offset) for (name, tensor), offset in placed]
    size = sources[-1][3] + sources[-1][1].numel()
    buffer = torch.empty(size, dtype=torch.uint8, device=device) if allocate is None else allocate(size)
    metas = []
    end = 0
    for name, raw, tensor, offset in sources:
        buffer[end:offset].zero_()  # alignment gap: zeroed so stale memory never goes on the wire
        buffer[offset : offset + raw.numel()].copy_(raw)
        end = offset + raw.numel()
        metas.append(TensorMeta(name, tensor.dtype, tuple(tensor.shape), offset, raw.numel()))
    return Bucket(tuple(metas), buffer)


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    device: torch.device | str = "cpu",
    allocate: Allocate | None = None,
) -> Iterator[Bucket]:
    """Pack a stream of `(name, tensor)` into buckets of at most `bucket_bytes`, lazily, in stream order
    (each buffer from `allocate` when given, see `pack_bucket`)."""

    def sized() -> Iterator[tuple[tuple[str, torch.Tensor], int]]:
        for name, tensor in named_tensors:
            checked = _check_tensor(name, tensor)
            yield (name, checked), checked.numel() * checked.element_size()

    for placed in plan_buckets(sized(), bucket_bytes):
        yield pack_bucket(placed, device, allocate)


def unpack_bucket(metas: Sequence[TensorMeta], buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The bucket's tensors as views into `buffer` (no copy): same dtype, shape and bytes as were packed.

    The views keep `buffer` alive; a loader that copies them into model weights and drops them frees it.
    """
    if buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise ValueError(f"a bucket buffer is 1-D uint8, got {buffer.dtype} of shape {tuple(buffer.shape)}")
    out = []
    for meta in metas:
        if meta.offset + meta.nbytes > buffer.numel():
            raise ValueError(
                f"tensor '{meta.name}' spans bytes {meta.offset}..{meta.offset + meta.nbytes} "
                f"but the bucket holds {buffer.numel()}"
            )
        raw = buffer[meta.offset : meta.offset + meta.nbytes]
        out.append((meta.name, raw.view(meta.dtype).reshape(meta.shape)))
    return out
