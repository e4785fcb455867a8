"""MoE routing records over HTTP: the compact JSON form of `GenerationOutput.routed_experts`.

The token endpoint (`/v1/quartet/generate`) returns a response's recorded routing when its request sets
`"return_routed_experts": true` (quartet's own `HttpReplicaClient(routed_experts=True)` does); no other
endpoint returns it, and no endpoint reads routing from a client: a record is only ever the engine's own,
sent from the replica to the trainer's side (docs/moe_routing_replay.md, "Over HTTP").

    {"shape": [T, L, k], "dtype": "uint8", "data": "<base64 of the T*L*k bytes, C order>"}

T = prompt + response - 1 tokens (every token the engine fed), L MoE layers, k experts per token; the
dtype is the record's (`quartet.core.routing.routing_dtype`: uint8 up to 256 experts, else int16, little
endian). Base64 costs 4/3 of the raw bytes: 2 x 2 x 4/3 = 5.3 bytes a token for the tiny MoE, 512 for
Qwen3-30B-A3B (48 layers, k = 8). `routing_from_json` is strict: whatever a replica (or anything posing as
one) sends that is not exactly one such record for the response's tokens is a `ValueError`, which the
client turns into a failure of that request alone.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["routing_from_json", "routing_to_json"]

_DTYPES: dict[str, tuple[torch.dtype, np.dtype[Any]]] = {
    "uint8": (torch.uint8, np.dtype("uint8")),
    "int16": (torch.int16, np.dtype("<i2")),
}
_NAMES = {torch_dtype: name for name, (torch_dtype, _) in _DTYPES.items()}
_MAX_LAYERS_X_K = 1 << 16
"""A record's L x k above this is refused (no model routes a token to that many layer-experts)."""


def routing_to_json(record: torch.Tensor) -> dict[str, Any]:
    """`record` [T, L, k] (uint8 or int16) as the JSON object of the module docstring."""
    if record.dim() != 3 or record.dtype not in _NAMES:
        shape = tuple(record.shape)
        raise ValueError(f"a routing record is [T, L, k] uint8 or int16, got {shape} {record.dtype}")
    name = _NAMES[record.dtype]
    raw = record.detach().cpu().contiguous().numpy().astype(_DTYPES[name][1], copy=False).tobytes()
    return {"shape": list(record.shape), "dtype": name, "data": base64.b64encode(raw).decode("ascii")}


def routing_from_json(obj: Any, tokens: int) -> torch.Tensor:
    """The record [tokens, L, k] of `obj` (`routing_to_json`'s form); ValueError on anything else: a
    wrong shape or token count, an unknown dtype, data that is not base64 of exactly that many bytes."""
    if not isinstance(obj, Mapping) or set(obj) != {"shape", "dtype", "data"}:
        raise ValueError("routed_experts must be an object with exactly 'shape', 'dtype' and 'data'")
    shape = obj["shape"]
    name = obj["dtype"]
    data = obj["data"]
    if (
        not isinstance(shape, list)
        or len(shape) != 3
        or any(isinstance(d, bool) or not isinstance(d, int) for d in shape)
    ):
        raise ValueError(f"routed_experts.shape must be three integers [T, L, k], got {shape!r:.60}")
    t, layers, k = shape
    if t != tokens:
        raise ValueError(f"routed_experts covers {t} tokens; the response's fed tokens are {tokens}")
    if layers < 1 or k < 1 or layers * k > _MAX_LAYERS_X_K:
        raise ValueError(f"routed_experts.shape {shape} is not a routing record's [T, L >= 1, k >= 1]")
    if name not in _DTYPES:
        raise ValueError(f"routed_experts.dtype must be one of {sorted(_DTYPES)}, got {name!r:.40}")
    torch_dtype, np_dtype = _DTYPES[name]
    if not isinstance(data, str):
        raise ValueError("routed_experts.data must be a base64 string")
    expected = t * layers * k * np_dtype.itemsize
    if len(data) != 4 * ((expected + 2) // 3):  # checked before decoding: no oversized allocation
        raise ValueError(f"routed_experts.data holds {len(data)} base64 characters, not {expected} bytes")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("routed_experts.data is not valid base64") from None
    if len(raw) != expected:
        raise ValueError(f"routed_experts.data decodes to {len(raw)} bytes, not {expected}")
    values = np.frombuffer(raw, dtype=np_dtype).reshape(t, layers, k)
    if np_dtype.kind == "i" and values.size and int(values.min()) < 0:
        raise ValueError("routed_experts holds a negative expert index")
    return torch.from_numpy(values.astype(np_dtype.newbyteorder("="), copy=True)).to(torch_dtype)
