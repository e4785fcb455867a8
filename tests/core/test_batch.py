"""The Batch type: row and column operations, padding for dispatch, and serialization (pickle and Ray)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.core.batch import Batch, BatchError, BatchMeta


def make(rows: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        {
            "responses": torch.randint(0, 100, (rows, 5), generator=g),
            "logprobs": torch.randn(rows, 5, generator=g),
            "mask": torch.rand(rows, 5, generator=g) > 0.5,
            "half": torch.randn(rows, 2, generator=g).to(torch.bfloat16),
        },
        {"ground_truth": [f"gt{seed}-{i}" for i in range(rows)], "kwargs": [{"i": i} for i in range(rows)]},
        BatchMeta(global_step=3, temperature=0.7),
    )


def rows_of(batch: Batch) -> list[tuple[object, ...]]:
    """Each row as a plain tuple, computed independently of the Batch operations under test."""
    out = []
    for i in range(len(batch)):
        out.append(
            (
                tuple(batch.tensors["responses"][i].tolist()),
                tuple(batch.tensors["logprobs"][i].tolist()),
                tuple(batch.tensors["mask"][i].tolist()),
                tuple(batch.tensors["half"][i].float().tolist()),
                batch.non_tensors["ground_truth"][i],
                batch.non_tensors["kwargs"][i]["i"],
            )
        )
    return out


# ---- construction ---------------------------------------------------------------------------------------


def test_construction_checks_sizes_and_keys() -> None:
    with pytest.raises(BatchError, match="disagree"):
        Batch({"a": torch.zeros(3, 2), "b": torch.zeros(4)})
    with pytest.raises(BatchError, match="3 rows"):
        Batch({"a": torch.zeros(2)}, {"x": [1, 2, 3]})
    with pytest.raises(BatchError, match="both tensor and non-tensor"):
        Batch({"a": torch.zeros(2)}, {"a": [1, 2]})
    with pytest.raises(BatchError, match="no batch dimension"):
        Batch({"a": torch.tensor(1.0)})
    assert len(Batch(non_tensors={"x": [1, 2, 3]})) == 3


def test_column_access_and_missing_key() -> None:
    b = make(4)
    assert torch.equal(b["responses"], b.tensors["responses"])
    assert list(b["ground_truth"]) == [f"gt0-{i}" for i in range(4)]
    with pytest.raises(KeyError, match="has"):
        b["nope"]
    assert "mask" in b and "ground_truth" in b and "nope" not in b


# ---- rows -----------------------------------------------------------------------------------------------


def test_index_forms_select_the_same_rows() -> None:
    b = make(6)
    expected = [rows_of(b)[i] for i in (1, 4)]
    assert rows_of(b[[1, 4]]) == expected
    assert rows_of(b[torch.tensor([1, 4])]) == expected
    assert rows_of(b[np.array([1, 4])]) == expected
    assert rows_of(b[torch.tensor([False, True, False, False, True, False])]) == expected
    assert rows_of(b[1:5:3]) == expected
    assert rows_of(b[-2]) == [rows_of(b)[4]]
    with pytest.raises(IndexError):
        b[6]


def test_select_and_drop_columns() -> None:
    b = make(3)
    s = b.select("responses", "ground_truth")
    assert set(s.keys()) == {"responses", "ground_truth"} and len(s) == 3
    assert set(b.drop("mask", "kwargs").keys()) == {"responses", "logprobs", "half", "ground_truth"}
    with pytest.raises(KeyError):
        b.select("missing")


def test_union_merges_and_rejects_conflicts() -> None:
    b = make(3)
    values = Batch({"values": torch.arange(3.0)}, {"tag": ["a", "b", "c"]})
    u = b.union(values)
    assert set(u.keys()) == set(b.keys()) | {"values", "tag"}
    assert u.meta == b.meta
    assert b.union(b.select("responses")) == b  # equal overlapping columns are fine
    with pytest.raises(BatchError, match="conflict: column 'responses'"):
        b.union(Batch({"responses": torch.zeros(3, 5, dtype=torch.long)}))
    with pytest.raises(BatchError, match="conflict: column 'ground_truth'"):
        b.union(Batch(non_tensors={"ground_truth": ["x", "y", "z"]}))
    with pytest.raises(BatchError, match="rows"):
        b.union(make(2))


def test_reorder_needs_a_permutation() -> None:
    b = make(4)
    assert rows_of(b.reorder([2, 0, 3, 1])) == [rows_of(b)[i] for i in (2, 0, 3, 1)]
    with pytest.raises(BatchError, match="permutation"):
        b.reorder([0, 0, 1, 2])


def test_chunk_refuses_uneven_split_and_points_to_padding() -> None:
    with pytest.raises(BatchError, match="pad_to_divisor"):
        make(5).chunk(2)


def test_concat_checks_columns_dtypes_and_meta() -> None:
    a = make(2)
    with pytest.raises(BatchError, match="columns"):
        Batch.concat([a, a.drop("mask")])
    with pytest.raises(BatchError, match="meta"):
        Batch.concat([a, a.with_meta(global_step=4)])
    other = Batch({**dict(a.tensors.items()), "logprobs": a["logprobs"].double()}, a.non_tensors, a.meta)
    with pytest.raises(BatchError, match="logprobs"):
        Batch.concat([a, other])


# ---- property-based round trips -------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), parts=st.integers(1, 9), seed=st.integers(0, 10_000))
def test_pad_chunk_concat_unpad_round_trip(rows: int, parts: int, seed: int) -> None:
    b = make(rows, seed)
    padded, pad = b.pad_to_divisor(parts)
    assert pad == (-rows) % parts and len(padded) % parts == 0
    assert rows_of(padded)[rows:] == [rows_of(b)[i % rows] for i in range(pad)]  # padding copies real rows
    chunks = padded.chunk(parts)
    assert all(len(c) == len(padded) // parts for c in chunks)
    joined = Batch.concat(chunks).unpad(pad)
    assert joined == b
    assert rows_of(joined) == rows_of(b)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 20), times=st.integers(1, 5), interleave=st.booleans(), seed=st.integers(0, 10_000)
)
def test_repeat_matches_list_repetition(rows: int, times: int, interleave: bool, seed: int) -> None:
    b = make(rows, seed)
    original = rows_of(b)
    expected = [r for r in original for _ in range(times)] if interleave else original * times
    assert rows_of(b.repeat(times, interleave=interleave)) == expected


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 30), data=st.data())
def test_reorder_then_inverse_is_identity(rows: int, data: st.DataObject) -> None:
    b = make(rows)
    perm = data.draw(st.permutations(list(range(rows))))
    inverse = [0] * rows
    for pos, src in enumerate(perm):
        inverse[src] = pos
    assert b.reorder(perm).reorder(inverse) == b


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 30), cut=st.data())
def test_slice_concat_round_trip(rows: int, cut: st.DataObject) -> None:
    b = make(rows)
    k = cut.draw(st.integers(0, rows))
    assert Batch.concat([b.slice(0, k), b.slice(k, rows)]) == b


# ---- serialization --------------------------------------------------------------------------------------


def test_pickle_round_trip_keeps_everything() -> None:
    b = make(7)
    back = pickle.loads(pickle.dumps(b))
    assert back == b
    assert back["half"].dtype == torch.bfloat16 and back["mask"].dtype == torch.bool
    assert back.meta == BatchMeta(global_step=3, temperature=0.7)
    back.tensors["responses"][0, 0] = -1  # writable, and not shared with the original
    assert b["responses"][0, 0] != -1


def test_pickled_chunk_carries_only_its_own_rows() -> None:
    big = make(1000)
    chunk = big.slice(0, 10)
    assert (
        chunk["logprobs"].untyped_storage().nbytes() == big["logprobs"].untyped_storage().nbytes()
    )  # a view
    assert len(pickle.dumps(chunk)) < len(pickle.dumps(big)) / 20


def test_non_contiguous_tensors_survive_pickling() -> None:
    t = torch.arange(24).reshape(4, 6)[:, ::2]
    assert not t.is_contiguous()
    back = pickle.loads(pickle.dumps(Batch({"t": t})))
    assert torch.equal(back["t"], t)


@pytest.mark.ray
def test_ray_round_trip(ray_cluster: None) -> None:
    import ray

    b = make(64)
    assert ray.get(ray.put(b)) == b

    @ray.remote
    def double(batch: Batch) -> Batch:
        return batch.union(Batch({"twice": batch["logprobs"] * 2}))

    out = ray.get(double.remote(b), timeout=60)
    assert torch.equal(out["twice"], b["logprobs"] * 2)
    assert list(out["ground_truth"]) == list(b["ground_truth"])
