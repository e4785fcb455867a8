"""The JSON form of a routing record over HTTP: exact round trip, and every malformed record refused."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import torch

from quartet.serving.routing_wire import routing_from_json, routing_to_json


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16])
def test_a_record_round_trips_exactly(dtype: torch.dtype) -> None:
    high = 256 if dtype is torch.uint8 else 3000
    record = torch.randint(0, high, (7, 3, 4), generator=torch.Generator().manual_seed(0)).to(dtype)
    wire = routing_to_json(record)
    raw = base64.b64decode(wire["data"])
    assert len(raw) == record.numel() * record.element_size()  # the raw bytes, nothing more
    back = routing_from_json(wire, 7)
    assert back.dtype == dtype and torch.equal(back, record)


def _wire() -> dict[str, Any]:
    return routing_to_json(torch.arange(24, dtype=torch.uint8).view(6, 2, 2))


@pytest.mark.parametrize(
    ("change", "tokens", "says"),
    [
        ({}, 5, "covers 6 tokens"),
        ({"shape": [6, 2]}, 6, "three integers"),
        ({"shape": [6, 2, True]}, 6, "three integers"),
        ({"shape": [6, 0, 2]}, 6, "not a routing record"),
        ({"shape": [6, 1 << 16, 2]}, 6, "not a routing record"),
        ({"dtype": "int64"}, 6, "dtype"),
        ({"data": 5}, 6, "base64 string"),
        ({"data": "AAAA"}, 6, "base64 characters"),
        ({"data": "!" * 32}, 6, "not valid base64"),
        ({"extra": 1}, 6, "exactly"),
        ({"dtype": "int16", "data": base64.b64encode(b"\xff\xff" * 24).decode()}, 6, "negative"),
    ],
)
def test_a_malformed_record_is_refused(change: dict[str, Any], tokens: int, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        routing_from_json({**_wire(), **change}, tokens)


def test_not_an_object_is_refused() -> None:
    for value in (None, [], "x", 3):
        with pytest.raises(ValueError, match="object"):
            routing_from_json(value, 6)
