"""The batch of RL samples that crosses every role boundary.

A `Batch` holds, for B samples (rows):
- `tensors`: a `tensordict.TensorDict` with batch size [B]; every tensor's first dimension is B. Names used by
  the trainer (shapes for B samples, prompt length P, response length R):
    prompts [B, P] int64 (left-padded), responses [B, R] int64 (right-padded),
    attention_mask [B, P+R], response_mask [B, R] (1 = token written by the model),
    rollout_logprobs / old_logprobs / ref_logprobs [B, R] float32, values [B, R], token_level_scores [B, R],
    advantages [B, R], returns [B, R].
- `non_tensors`: named per-sample Python objects (ground truths, data sources, tool kwargs), each a numpy
  object array of length B.
- `meta`: a small typed `BatchMeta` shared by all rows.

Every operation returns a new Batch; rows are never dropped or duplicated silently (padding is explicit and
returns the count to remove later).

Serialization (pickle, hence Ray): each tensor is sent as one contiguous numpy byte view of exactly its own
elements, which Ray's pickle-5 path places in the object store without an extra copy. Pickling the tensors
themselves would send each tensor's whole storage, so a chunk of a larger batch would carry the full batch.
On arrival the bytes are copied once into fresh, writable tensors (object-store memory is read-only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["Batch", "BatchError", "BatchMeta"]

RowIndex = slice | int | Sequence[int] | torch.Tensor | np.ndarray


class BatchError(ValueError):
    """An operation on batches whose shapes, keys or sizes do not fit together."""


@dataclass(frozen=True)
class BatchMeta:
    """Facts that hold for every row of a batch."""

    global_step: int = 0
    """Training step that produced the batch."""

    temperature: float = 1.0
    """Sampling temperature of the responses; log-prob passes must use the same one."""

    validation: bool = False
    """True for validation batches (no training on them)."""

    def replace(self, **changes: Any) -> BatchMeta:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


def _as_object_column(name: str, values: Any, length: int | None) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        col = values
    else:
        col = np.empty(len(values), dtype=object)
        col[:] = list(values)
    if length is not None and len(col) != length:
        raise BatchError(f"non-tensor column '{name}' has {len(col)} rows, the batch has {length}")
    return col


class Batch:
    """B samples: tensors with a leading batch dimension, per-sample objects, and shared metadata."""

    __slots__ = ("meta", "non_tensors", "tensors")

    def __init__(
        self,
        tensors: TensorDict | Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta: BatchMeta | None = None,
        batch_size: int | None = None,
    ) -> None:
        tensors = tensors if tensors is not None else {}
        non_tensors = non_tensors or {}
        if isinstance(tensors, TensorDict):
            if tensors.batch_dims != 1:
                raise BatchError(
                    f"tensors must have one batch dimension, got batch_size={list(tensors.batch_size)}"
                )
            size = tensors.batch_size[0]
        else:
            scalars = [k for k, v in tensors.items() if v.dim() == 0]
            if scalars:
                raise BatchError(f"scalar tensors have no batch dimension: {scalars}")
            sizes = {k: int(v.shape[0]) for k, v in tensors.items()}
            distinct = set(sizes.values()) | ({batch_size} if batch_size is not None else set())
            if len(distinct) > 1:
                raise BatchError(f"tensors disagree on the batch size: {sizes}")
            if distinct:
                size = next(iter(distinct))
            else:
                size = len(next(iter(non_tensors.values()))) if non_tensors else 0
            tensors = TensorDict(dict(tensors), batch_size=[size])
        if batch_size is not None and batch_size != size:
            raise BatchError(f"batch_size={batch_size} but the tensors have {size} rows")
        self.tensors: TensorDict = tensors
        self.non_tensors: dict[str, np.ndarray] = {
            k: _as_object_column(k, v, size) for k, v in non_tensors.items()
        }
        both = set(self.tensors.keys()) & set(self.non_tensors)
        if both:
            raise BatchError(f"keys are both tensor and non-tensor columns: {sorted(both)}")
        self.meta: BatchMeta = meta or BatchMeta()

    # ---- inspection -------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.tensors.batch_size[0])

    def keys(self) -> list[str]:
        """Tensor column names, then non-tensor column names."""
        return [str(k) for k in self.tensors.keys()] + list(self.non_tensors)  # noqa: SIM118 - iterating a TensorDict yields rows

    def __contains__(self, key: object) -> bool:
        return key in self.non_tensors or (isinstance(key, str) and key in self.tensors)

    def get(self, key: str, default: Any = None) -> Any:
        """Column `key` (tensor or non-tensor), or `default` when the batch has no such column."""
        return self[key] if key in self else default  # noqa: SIM401 - this is get()

    def __repr__(self) -> str:
        cols = ", ".join(
            f"{k}: {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in self.tensors.items()
        )
        objs = ", ".join(self.non_tensors)
        return f"Batch(len={len(self)}, tensors={{{cols}}}, non_tensors=[{objs}], meta={self.meta})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        if len(self) != len(other) or self.meta != other.meta or set(self.keys()) != set(other.keys()):
            return False
        theirs = other.columns()
        for k, v in self.columns().items():
            if v.dtype != theirs[k].dtype or not torch.equal(v, theirs[k]):
                return False
        return all(list(v) == list(other.non_tensors[k]) for k, v in self.non_tensors.items())

    __hash__ = None  # type: ignore[assignment]

    def __getitem__(self, key: str | RowIndex) -> Any:
        """`batch["name"]` is a column (tensor or object array); any other index selects rows."""
        if isinstance(key, str):
            if key in self.non_tensors:
                return self.non_tensors[key]
            if key in self.tensors:
                return self.tensors[key]
            raise KeyError(f"no column '{key}'; the batch has {self.keys()}")
        return self.index(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    # ---- rows -------------------------------------------------------------------------------------------

    def index(self, rows: RowIndex) -> Batch:
        """Rows by slice, integer (kept as a batch of one), integer list/array/tensor, or boolean mask."""
        if isinstance(rows, int):
            n = len(self)
            if not -n <= rows < n:
                raise IndexError(f"row {rows} out of range for a batch of {n}")
            rows = slice(rows % n, rows % n + 1)
        if isinstance(rows, slice):
            np_rows: slice | np.ndarray = rows
            t_rows: slice | torch.Tensor = rows
        else:
            t_rows = torch.as_tensor(np.asarray(rows) if not isinstance(rows, torch.Tensor) else rows)
            if t_rows.dtype == torch.bool:
                if t_rows.shape != (len(self),):
                    raise BatchError(
                        f"boolean mask of shape {tuple(t_rows.shape)} for a batch of {len(self)}"
                    )
                t_rows = t_rows.nonzero().flatten()
            t_rows = t_rows.to(torch.long).flatten()
            np_rows = t_rows.numpy()
        return Batch(
            self.tensors[t_rows],
            {k: v[np_rows] for k, v in self.non_tensors.items()},
            self.meta,
            batch_size=len(range(len(self))[np_rows]) if isinstance(np_rows, slice) else len(np_rows),
        )

    def slice(self, start: int, stop: int) -> Batch:
        """Rows start..stop-1."""
        return self.index(slice(start, stop))

    def reorder(self, order: Sequence[int] | torch.Tensor) -> Batch:
        """The same rows in the order given by a permutation of range(len(self))."""
        perm = torch.as_tensor(order, dtype=torch.long)
        if perm.shape != (len(self),) or not torch.equal(perm.sort().values, torch.arange(len(self))):
            raise BatchError(f"reorder needs a permutation of range({len(self)}), got {perm.tolist()[:16]}")
        return self.index(perm)

    def repeat(self, times: int, interleave: bool = True) -> Batch:
        """Each row `times` times: interleaved [a,a,b,b] (samples of a prompt adjacent) or tiled [a,b,a,b]."""
        if times < 1:
            raise BatchError(f"repeat needs times >= 1, got {times}")
        idx = torch.arange(len(self))
        idx = idx.repeat_interleave(times) if interleave else idx.repeat(times)
        return self.index(idx)

    def chunk(self, parts: int) -> list[Batch]:
        """Split into `parts` equal consecutive chunks; the length must divide (see `pad_to_divisor`)."""
        if parts < 1 or len(self) % parts:
            raise BatchError(
                f"cannot split a batch of {len(self)} rows into {parts} equal chunks; "
                "pad it first with pad_to_divisor(parts) and unpad the joined result"
            )
        size = len(self) // parts
        return [self.slice(i * size, (i + 1) * size) for i in range(parts)]

    def pad_to_divisor(self, divisor: int) -> tuple[Batch, int]:
        """Append copies of the first rows until `divisor` divides the length; return (padded, rows added).

        Padding rows are real samples (copies), so every rank computes on valid data; `unpad(count)` removes
        them from the joined output.
        """
        if divisor < 1:
            raise BatchError(f"divisor must be >= 1, got {divisor}")
        n = len(self)
        pad = (-n) % divisor
        if pad == 0:
            return self, 0
        if n == 0:
            raise BatchError("cannot pad an empty batch")
        extra = self.index(torch.arange(pad) % n)
        return Batch.concat([self, extra]), pad

    def unpad(self, count: int) -> Batch:
        """Drop the last `count` rows (the padding added by `pad_to_divisor`)."""
        if not 0 <= count <= len(self):
            raise BatchError(f"cannot remove {count} padding rows from a batch of {len(self)}")
        return self if count == 0 else self.slice(0, len(self) - count)

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Rows of all batches in order; they must have the same columns, dtypes and meta."""
        if not batches:
            raise BatchError("concat needs at least one batch")
        first = batches[0]
        for i, b in enumerate(batches[1:], start=1):
            if set(b.keys()) != set(first.keys()):
                raise BatchError(
                    f"batch {i} has columns {sorted(b.keys())}, batch 0 has {sorted(first.keys())}"
                )
            if b.meta != first.meta:
                raise BatchError(f"batch {i} has meta {b.meta}, batch 0 has {first.meta}")
            ref_columns = first.columns()
            for k, v in b.columns().items():
                ref = ref_columns[k]
                if v.dtype != ref.dtype or v.shape[1:] != ref.shape[1:]:
                    raise BatchError(
                        f"column '{k}': batch {i} is {v.dtype} {tuple(v.shape[1:])}, "
                        f"batch 0 is {ref.dtype} {tuple(ref.shape[1:])}"
                    )
        tensors: TensorDict | None = None
        if first.tensors.keys():
            tensors = torch.cat([b.tensors for b in batches], dim=0)  # type: ignore[assignment]
        return Batch(
            tensors,
            {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors},
            first.meta,
            batch_size=sum(len(b) for b in batches),
        )

    # ---- columns ----------------------------------------------------------------------------------------

    def select(self, *keys: str) -> Batch:
        """Only the named columns (tensor or non-tensor); unknown names are an error."""
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"no column(s) {missing}; the batch has {self.keys()}")
        t_keys = [k for k in keys if k not in self.non_tensors]
        return Batch(
            self.tensors.select(*t_keys),
            {k: self.non_tensors[k] for k in keys if k in self.non_tensors},
            self.meta,
            batch_size=len(self),
        )

    def drop(self, *keys: str) -> Batch:
        """All columns but the named ones."""
        return self.select(*[k for k in self.keys() if k not in keys])

    def union(self, other: Batch) -> Batch:
        """Columns of both, row for row. A key in both must hold equal values; `self.meta` is kept."""
        if len(other) != len(self):
            raise BatchError(f"union of batches with {len(self)} and {len(other)} rows")
        tensors = self.columns()
        for k, v in other.columns().items():
            if k in self.non_tensors:
                raise BatchError(f"column '{k}' is a tensor in one batch and an object column in the other")
            if k in tensors and (tensors[k].shape != v.shape or not torch.equal(tensors[k], v)):
                raise BatchError(f"union conflict: column '{k}' differs between the two batches")
            tensors[k] = v
        non_tensors = dict(self.non_tensors)
        for k, col in other.non_tensors.items():
            if k in tensors:
                raise BatchError(f"column '{k}' is a tensor in one batch and an object column in the other")
            if k in non_tensors and list(non_tensors[k]) != list(col):
                raise BatchError(f"union conflict: column '{k}' differs between the two batches")
            non_tensors[k] = col
        return Batch(tensors, non_tensors, self.meta, batch_size=len(self))

    def columns(self) -> dict[str, torch.Tensor]:
        """The tensor columns as a plain dict (the tensors themselves, not copies)."""
        return {str(k): v for k, v in self.tensors.items() if isinstance(v, torch.Tensor)}

    def with_meta(self, **changes: Any) -> Batch:
        """The same rows with some meta fields changed."""
        return Batch(self.tensors, self.non_tensors, self.meta.replace(**changes), batch_size=len(self))

    def to(self, device: torch.device | str) -> Batch:
        """Tensors moved to `device` (non-tensor columns stay where they are)."""
        return Batch(self.tensors.to(device), self.non_tensors, self.meta, batch_size=len(self))

    # ---- serialization ----------------------------------------------------------------------------------

    def __reduce__(self) -> tuple[Any, ...]:
        specs = []
        buffers = []
        for k, v in self.columns().items():
            t = v.detach().to("cpu").contiguous()
            specs.append((str(k), str(t.dtype).removeprefix("torch."), tuple(t.shape)))
            buffers.append(t.reshape(-1).view(torch.uint8).numpy())
        return (_rebuild, (len(self), specs, buffers, self.non_tensors, self.meta))


def _rebuild(
    size: int,
    specs: list[tuple[str, str, tuple[int, ...]]],
    buffers: list[np.ndarray],
    non_tensors: dict[str, np.ndarray],
    meta: BatchMeta,
) -> Batch:
    tensors = {}
    for (key, dtype, shape), buf in zip(specs, buffers, strict=True):
        # One copy out of (read-only) object-store memory into a writable tensor.
        flat = torch.from_numpy(np.array(buf, copy=True))
        tensors[key] = flat.view(getattr(torch, dtype)).reshape(shape)
    return Batch(TensorDict(tensors, batch_size=[size]), non_tensors, meta, batch_size=size)
