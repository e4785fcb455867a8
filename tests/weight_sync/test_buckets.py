"""Bucket planning, packing and unpacking: bitwise round trips for every dtype and layout, bucket
boundaries checked against hand-computed offsets, and lazy consumption of the tensor stream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.weight_sync import Bucket, TensorMeta, iter_buckets, pack_bucket, plan_buckets, unpack_bucket
from quartet.weight_sync.buckets import ALIGN_BYTES

Named = list[tuple[str, torch.Tensor]]


def raw(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as uint8, so NaN payloads and -0.0 compare bitwise under torch.equal."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def random_bits(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A tensor of `dtype` whose bytes are uniformly random: floats include NaNs of many payloads."""
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.Size(shape).numel()) * dtype.itemsize
    data = torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)
    if dtype == torch.bool:
        data = data % 2  # only 0 and 1 are valid bools
    return data.view(dtype).reshape(shape)


def round_trip(named: Named, bucket_bytes: int = 1 << 20) -> tuple[list[Bucket], Named]:
    buckets = list(iter_buckets(iter(named), bucket_bytes))
    return buckets, [item for b in buckets for item in unpack_bucket(b.metas, b.buffer)]


def assert_same(got: Named, want: Named) -> None:
    assert [name for name, _ in got] == [name for name, _ in want]
    for (name, g), (_, w) in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(raw(g), raw(w)), name


DTYPES = [
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bitwise(dtype: torch.dtype) -> None:
    named = [
        ("matrix", random_bits((7, 5), dtype, seed=1)),
        ("scalar", random_bits((), dtype, seed=2)),
        ("empty", random_bits((0, 3), dtype)),
        ("vector", random_bits((13,), dtype, seed=3)),
    ]
    _, got = round_trip(named, bucket_bytes=128)
    assert_same(got, named)


def test_every_16_bit_float_pattern_survives() -> None:
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)  # all 65536 bit patterns
    named = [("bf16", every.view(torch.bfloat16)), ("f16", every.view(torch.float16))]
    assert torch.isnan(named[0][1]).sum() > 100  # NaNs with hundreds of different payloads
    _, got = round_trip(named, bucket_bytes=100_000)
    assert_same(got, named)


def test_special_float_values_survive() -> None:
    values = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, 3.0])
    nan_payloads = torch.tensor([0x7FC00001, 0xFFC12345, 0x7F800001], dtype=torch.int64).to(torch.int32)
    named = [
        ("bf16", values.bfloat16()),
        ("f16", values.half()),
        ("f32_nans", nan_payloads.view(torch.float32)),
    ]
    _, got = round_trip(named)
    assert_same(got, named)
    assert torch.signbit(got[0][1][1])  # -0.0 kept its sign


def test_non_contiguous_and_view_inputs_arrive_as_their_values() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    named = [
        ("transposed", base.t()),
        ("strided", base[:, ::2]),
        ("expanded", torch.arange(3).expand(4, 3)),  # stride 0
        ("conj", torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()),
        ("param", torch.nn.Parameter(torch.ones(2, 2))),
    ]
    _, got = round_trip(named)
    for (name, g), (_, w) in zip(got, named, strict=True):
        assert g.is_contiguous() and g.shape == w.shape, name
        assert torch.equal(g, w.detach().resolve_conj()), name
    assert torch.equal(got[3][1], torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))


def test_metadata_names_dtypes_shapes_and_aligned_offsets() -> None:
    named = [("a", torch.ones(10, dtype=torch.uint8)), ("b", torch.ones(3, dtype=torch.int64))]
    (bucket,) = list(iter_buckets(iter(named)))
    assert bucket.metas == (
        TensorMeta("a", torch.uint8, (10,), 0, 10),
        TensorMeta("b", torch.int64, (3,), 64, 24),  # 10 bytes rounded up to the 64-byte alignment
    )
    assert bucket.nbytes == 64 + 24
    assert torch.equal(bucket.buffer[10:64], torch.zeros(54, dtype=torch.uint8))  # gaps are zeroed
    for meta in bucket.metas:
        assert TensorMeta.from_wire(meta.to_wire()) == meta


def test_bucket_boundaries_exact_fit_cap_below_one_tensor_and_many_small() -> None:
    def plan(sizes: list[int], cap: int) -> list[list[tuple[int, int]]]:
        return list(plan_buckets(enumerate(sizes), cap))

    assert plan([64, 64], 128) == [[(0, 0), (1, 64)]]  # exact fit
    assert plan([64, 64], 127) == [[(0, 0)], [(1, 0)]]
    assert plan([10, 10], 74) == [[(0, 0), (1, 64)]]  # the second starts at the aligned offset 64
    assert plan([10, 10], 73) == [[(0, 0)], [(1, 0)]]
    assert plan([5, 500, 5], 100) == [[(0, 0)], [(1, 0)], [(2, 0)]]  # too big for any bucket: alone
    assert plan([500], 100) == [[(0, 0)]]
    assert plan([0, 0, 4], 4) == [[(0, 0), (1, 0), (2, 0)]]  # empty tensors take no room
    many = plan([4] * 100, 640)  # slots at 0, 64, ..., 576: ten per bucket
    assert [len(b) for b in many] == [10] * 10
    assert [offset for _, offset in many[3]] == [64 * i for i in range(10)]
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan([1], 0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=40), st.integers(1, 400))
def test_plan_is_greedy_ordered_aligned_and_within_the_cap(sizes: list[int], cap: int) -> None:
    buckets = list(plan_buckets(enumerate(sizes), cap))
    assert [i for b in buckets for i, _ in b] == list(range(len(sizes)))
    for k, bucket in enumerate(buckets):
        end = 0
        for i, offset in bucket:
            assert offset % ALIGN_BYTES == 0 and offset >= end
            end = offset + sizes[i]
        assert end <= cap or len(bucket) == 1
        if k + 1 < len(buckets):  # greedy: the next bucket's first item did not fit here
            first = buckets[k + 1][0][0]
            assert -(-end // ALIGN_BYTES) * ALIGN_BYTES + sizes[first] > cap


def test_buckets_from_tensors_hold_at_most_the_cap() -> None:
    named = [(f"t{i}", random_bits((i % 7 + 1, 3), torch.float32, seed=i)) for i in range(30)]
    named.insert(10, ("huge", random_bits((100,), torch.float32)))  # 400 bytes > the 256 cap
    buckets, got = round_trip(named, bucket_bytes=256)
    assert_same(got, named)
    assert all(b.nbytes <= 256 or [m.name for m in b.metas] == ["huge"] for b in buckets)
    assert len(buckets) > 5


def test_the_stream_is_consumed_lazily() -> None:
    pulled: list[str] = []

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for i in range(10):
            pulled.append(f"t{i}")
            yield f"t{i}", torch.zeros(16, dtype=torch.uint8)

    buckets = iter_buckets(stream(), bucket_bytes=128)  # two 16-byte tensors per bucket (offsets 0, 64)
    first = next(buckets)
    assert [m.name for m in first.metas] == ["t0", "t1"]
    assert pulled == ["t0", "t1", "t2"]  # only one tensor of look-ahead


def test_bad_inputs_are_refused_with_the_tensor_name() -> None:
    with pytest.raises(TypeError, match="'w' is a list"):
        list(iter_buckets(iter([("w", [1, 2])])))  # type: ignore[list-item]
    with pytest.raises(TypeError, match="'s' has layout torch.sparse_coo"):
        list(iter_buckets(iter([("s", torch.eye(2).to_sparse())])))
    with pytest.raises(TypeError, match="'m' has layout"):
        list(iter_buckets(iter([("m", torch.empty(2, device="meta"))])))
    with pytest.raises(ValueError, match="at least one tensor"):
        pack_bucket([])


def test_corrupt_metadata_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'float128'"):
        TensorMeta.from_wire(["x", "float128", [2], 0, 32])
    with pytest.raises(ValueError, match="needs 8 bytes"):
        TensorMeta.from_wire(["x", "float32", [2], 0, 12])
    with pytest.raises(ValueError, match="multiple of 64"):
        TensorMeta.from_wire(["x", "float32", [2], 8, 8])
    meta = TensorMeta("x", torch.float32, (4,), 0, 16)
    with pytest.raises(ValueError, match="the bucket holds 8"):
        unpack_bucket([meta], torch.zeros(8, dtype=torch.uint8))
