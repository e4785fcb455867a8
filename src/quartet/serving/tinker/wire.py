"""The SDK's protobuf bodies as plain numpy data: `ForwardBackwardRequest` in, `ForwardBackwardOutput` out.

The schema is the SDK's own generated module (`tinker.proto.tinker_public_pb2`), imported here only: the
service needs the `tinker` extra. Every malformed part raises `WireError` naming the field, which the
server answers with a 400 (the SDK's `BadRequestError`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["Datum", "FwdBwdRequest", "WireError", "decode_forward_backward", "encode_forward_backward_output"]

_INT64, _FLOAT32 = 2, 1  # the schema's DType values the public wire uses
_NUMPY: dict[int, np.dtype[Any]] = {_FLOAT32: np.dtype("<f4"), _INT64: np.dtype("<i8")}


class WireError(ValueError):
    """A body that does not decode; `field` names the part at fault (e.g. `data[0].loss_fn_inputs`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclasses.dataclass(frozen=True)
class Datum:
    """One training example: its input tokens and its named loss inputs (flat arrays, declared shapes)."""

    tokens: np.ndarray
    loss_fn_inputs: Mapping[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class FwdBwdRequest:
    """A decoded forward_backward (or forward, `forward_only`) request."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: Mapping[str, float | str]
    forward_only: bool
    data: Sequence[Datum]


def _pb() -> Any:
    try:
        from tinker.proto import tinker_public_pb2  # type: ignore[import-not-found,unused-ignore]
    except ImportError as err:  # pragma: no cover - the extra is what makes this service exist
        raise RuntimeError(
            "the Tinker service needs the SDK: pip install -e '.[tinker]' -c constraints.txt"
        ) from err
    return tinker_public_pb2


def _tensor(msg: Any, field: str) -> np.ndarray:
    dtype = _NUMPY.get(msg.dtype)
    if dtype is None:
        raise WireError(field, f"dtype {msg.dtype} is not served (float32 or int64)")
    if any(n < 0 for n in msg.shape):
        raise WireError(field, f"shape {list(msg.shape)} has a negative dimension")
    if msg.HasField("sparse_csr"):
        return _sparse_csr(msg, dtype, field)
    if len(msg.dense) % dtype.itemsize:
        raise WireError(field, f"{len(msg.dense)} bytes is not a whole number of {dtype.name} values")
    array = np.frombuffer(msg.dense, dtype=dtype)
    shape = list(msg.shape)
    if shape and math.prod(shape) != array.size:
        raise WireError(field, f"shape {shape} does not hold the {array.size} values sent")
    result: np.ndarray = (array.reshape(shape) if shape else array).copy()
    return result  # frombuffer arrays are read-only


_MAX_SPARSE_ELEMENTS = 2**24
"""The most values a sparse tensor may densify to: what a dense one fits in the 64 MiB body cap."""


def _sparse_csr(msg: Any, dtype: np.dtype[Any], field: str) -> np.ndarray:
    """A 2-D sparse CSR tensor (the SDK sends 2-D `target_tokens` / `weights` so when it saves space),
    densified with 0 in every unlisted entry, as the SDK's `TensorData.to_numpy` does."""
    csr, shape = msg.sparse_csr, list(msg.shape)
    if len(shape) != 2:
        raise WireError(field, f"a sparse tensor must be 2-D, not of shape {shape}")
    rows, cols = shape
    if rows * cols > _MAX_SPARSE_ELEMENTS:
        raise WireError(field, f"shape {shape} is over {_MAX_SPARSE_ELEMENTS} values")
    if len(csr.values) % dtype.itemsize or len(csr.crow_indices) % 8 or len(csr.col_indices) % 8:
        raise WireError(field, "sparse values or indices are not whole numbers of their dtype")
    values = np.frombuffer(csr.values, dtype=dtype)
    crow = np.frombuffer(csr.crow_indices, dtype="<i8")
    col = np.frombuffer(csr.col_indices, dtype="<i8")
    nnz = values.size
    rising = crow.size == rows + 1 and crow[0] == 0 and crow[-1] == nnz and not (np.diff(crow) < 0).any()
    if not rising or col.size != nnz:
        raise WireError(field, "crow_indices must rise from 0 to the number of values, one per row + 1")
    if nnz and (col.min() < 0 or col.max() >= cols):
        raise WireError(field, f"col_indices must lie in [0, {cols})")
    row = np.repeat(np.arange(rows), np.diff(crow))
    flat = row * cols + col
    if (np.diff(flat) <= 0).any():
        raise WireError(field, "col_indices must rise within each row (no entry twice)")
    dense = np.zeros(rows * cols, dtype=dtype)
    dense[flat] = values
    return dense.reshape(rows, cols)


def _tokens(chunks: Any, field: str) -> np.ndarray:
    parts = []
    for i, chunk in enumerate(chunks):
        kind = chunk.WhichOneof("chunk")
        if kind not in (None, "encoded_text"):
            raise WireError(f"{field}[{i}]", f"{kind} chunks are not served yet (text tokens only)")
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise WireError(f"{field}[{i}]", "tokens are not whole int32 values")
        parts.append(np.frombuffer(raw, dtype="<i4").astype(np.int64))  # a copy
    if not parts or sum(p.size for p in parts) == 0:
        raise WireError(field, "no tokens")
    return np.concatenate(parts)


def decode_forward_backward(body: bytes, forward_only_default: bool = False) -> FwdBwdRequest:
    """The request in `body` (serialized protobuf, already decompressed)."""
    msg = _pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as err:  # protobuf's DecodeError
        raise WireError("body", f"not a ForwardBackwardRequest: {err}") from err
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = []
    for i, datum in enumerate(msg.data):
        tokens = _tokens(datum.model_input, f"data[{i}].model_input")
        inputs = {
            name: _tensor(t, f"data[{i}].loss_fn_inputs.{name}") for name, t in datum.loss_fn_inputs.items()
        }
        data.append(Datum(tokens=tokens, loss_fn_inputs=inputs))
    if not msg.model_id:
        raise WireError("model_id", "missing")
    only = bool(msg.forward_only) or forward_only_default
    return FwdBwdRequest(msg.model_id, int(msg.seq_id), msg.loss_fn, config, only, data)


def encode_forward_backward_output(
    outputs: Sequence[Mapping[str, np.ndarray]], metrics: Mapping[str, float]
) -> bytes:
    """The protobuf `ForwardBackwardOutput` of per-datum output arrays and the batch's metrics.

    An array of shape (N, K...) travels with `trailing_shape` [K...]; the SDK rebuilds each datum's shape
    from it. One `ArrayRecord` holds a run of datums whose arrays share their trailing shapes (the SDK's
    way to send ragged outputs, e.g. 2-D `logprobs` whose K differs between datums).
    """
    msg = _pb().ForwardBackwardOutput()
    msg.loss_fn_output_type = "ArrayRecord"
    for key, value in metrics.items():
        msg.metrics[key] = float(value)
    names = list(outputs[0]) if outputs else []
    runs: list[list[dict[str, np.ndarray]]] = []
    for output in outputs:
        arrays = {n: np.ascontiguousarray(output[n], dtype=np.float32) for n in names}
        if not runs or any(arrays[n].shape[1:] != runs[-1][0][n].shape[1:] for n in names):
            runs.append([])
        runs[-1].append(arrays)
    for run in runs:
        record = msg.loss_fn_outputs.add()
        record.num_datums = len(run)
        for name in names:
            batched = record.fields[name]
            batched.dtype = _FLOAT32
            batched.trailing_shape.extend(run[0][name].shape[1:])
            batched.data = b"".join(a[name].tobytes() for a in run)
            offsets = np.cumsum([0] + [a[name].nbytes for a in run]).astype("<i8")
            batched.offsets = offsets.tobytes()
    return bytes(msg.SerializeToString())
