"""Ray round-trip time of a `Batch` versus naive per-tensor pickling of the same tensors.

    .venv/bin/python benchmarks/batch_serialization.py [--rows 256] [--cols 2048] [--repeats 20]

The batch has the columns of one RL step at that size: prompts+responses ids, attention mask, response
mask (int64) and three float32 per-token columns, plus a ground-truth object column. The ways below are
timed in interleaved rounds (median of `--repeats`), after the object store's memory has been touched once
(its first use pays page faults that would otherwise land on whichever method runs first):
  batch        ray.get(ray.put(batch))                       quartet's path
  naive        ray.get(ray.put(t)) tensor by tensor          each tensor pickled by torch
  dict         ray.get(ray.put({name: tensor}))              one object, tensors pickled by torch
  pickle       pickle.loads(pickle.dumps(t)) per tensor      no Ray, no shared memory (a floor, not a path)
  chunks       8 dispatch chunks (row views of the batch) put and got, as Batch vs as dicts of views
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time

import ray
import torch

from quartet.core.batch import Batch


def make_batch(rows: int, cols: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    half = cols // 2
    tensors = {
        "input_ids": torch.randint(0, 32000, (rows, cols), generator=g),
        "attention_mask": torch.ones(rows, cols, dtype=torch.int64),
        "response_mask": torch.ones(rows, half, dtype=torch.int64),
        "old_logprobs": torch.randn(rows, half, generator=g),
        "ref_logprobs": torch.randn(rows, half, generator=g),
        "advantages": torch.randn(rows, half, generator=g),
    }
    return Batch(tensors, {"ground_truth": [str(i) for i in range(rows)]})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    batch = make_batch(args.rows, args.cols)
    as_dict = dict(batch.tensors.items())
    mib = sum(t.numel() * t.element_size() for t in as_dict.values()) / 2**20

    def via_batch() -> None:
        ray.get(ray.put(batch))

    def via_naive() -> None:
        ray.get([ray.put(t) for t in as_dict.values()])

    def via_dict() -> None:
        ray.get(ray.put(as_dict))

    def via_pickle() -> None:
        [pickle.loads(pickle.dumps(t)) for t in as_dict.values()]

    chunks = batch.chunk(8)
    dict_chunks = [dict(c.tensors.items()) for c in chunks]

    def chunks_batch() -> None:
        ray.get([ray.put(c) for c in chunks])

    def chunks_dict() -> None:
        ray.get([ray.put(c) for c in dict_chunks])

    # Correctness once, outside the timings.
    assert ray.get(ray.put(batch)) == batch
    assert Batch.concat(ray.get([ray.put(c) for c in chunks])) == batch

    # Touch the object store's memory once.
    warm = torch.zeros(64 * 2**20, dtype=torch.uint8).numpy()
    for _ in range(8):
        ray.get(ray.put(warm))

    methods = {
        "batch: ray.put/get of the Batch": via_batch,
        "naive: ray.put/get tensor by tensor": via_naive,
        "dict: ray.put/get of a dict of tensors": via_dict,
        "pickle: dumps/loads per tensor, no Ray": via_pickle,
        "chunks: 8 row chunks as Batch": chunks_batch,
        "chunks: 8 row chunks as dicts of views": chunks_dict,
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    results = {name: statistics.median(ts) for name, ts in times.items()}
    print(
        f"batch: {args.rows} x {args.cols}, {len(as_dict)} tensors, {mib:.1f} MiB, median of {args.repeats}"
    )
    for name, sec in results.items():
        print(f"  {name:<42} {sec * 1e3:8.2f} ms  (min {min(times[name]) * 1e3:.2f})")
    ours, naive = results["batch: ray.put/get of the Batch"], results["naive: ray.put/get tensor by tensor"]
    print(f"  Batch round trip: {naive / ours:.1f}x faster than naive per-tensor pickling through Ray")
    ratio = results["chunks: 8 row chunks as dicts of views"] / results["chunks: 8 row chunks as Batch"]
    print(f"  dispatch chunks: {ratio:.1f}x faster (views no longer carry the whole storage)")
    ray.shutdown()


if __name__ == "__main__":
    main()
