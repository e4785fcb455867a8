"""The SDK's protobuf bodies as plain numpy data: `ForwardBackwardRequest` in, `ForwardBackwardOutput` out.

The schema is the SDK's own generated module (`tinker.proto.tinker_public_pb2`), imported here only: the
service needs the `tinker` extra. Every malformed part raises `WireError` naming the field, which the
server answers with a 400 (the SDK's `BadRequestError`).
"""

from __future__ import annotations

import dataclasses
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
    if msg.HasField("sparse_csr"):
        raise WireError(field, "sparse tensors are not served yet")
    if len(msg.dense) % dtype.itemsize:
        raise WireError(field, f"{len(msg.dense)} bytes is not a whole number of {dtype.name} values")
    array = np.frombuffer(msg.dense, dtype=dtype)
    shape = list(msg.shape)
    if shape and int(np.prod(shape)) != array.size:
        raise WireError(field, f"shape {shape} does not hold the {array.size} values sent")
    result: np.ndarray = (array.reshape(shape) if shape else array).copy()
    return result  # frombuffer arrays are read-only


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
    """The protobuf `ForwardBackwardOutput` of per-datum output arrays (1-D each) and the batch's metrics."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput()
    msg.loss_fn_output_type = "ArrayRecord"
    for key, value in metrics.items():
        msg.metrics[key] = float(value)
    record = msg.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    names = list(outputs[0]) if outputs else []
    for name in names:
        arrays = [np.ascontiguousarray(o[name], dtype=np.float32).reshape(-1) for o in outputs]
        batched = record.fields[name]
        batched.dtype = _FLOAT32
        batched.data = b"".join(a.tobytes() for a in arrays)
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype("<i8")
        batched.offsets = offsets.tobytes()
    return bytes(msg.SerializeToString())
