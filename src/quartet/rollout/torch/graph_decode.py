"""Decode steps at bucketed shapes, replayed from CUDA graphs on a GPU.

A decode step of a small model is a few hundred tiny kernels; on a GPU their launches, not the arithmetic,
set its time. A CUDA graph records the kernels of one step once and replays them with one launch. A graph
replays fixed shapes at fixed addresses, so a step runs at a bucket:

- rows rounded up to a power of two (capped at the cache's slots). The padded rows decode token 0 at
  position 0 in slots that hold no running sequence: the engine keeps running sequences in slots 0..A-1,
  and a prefill rewrites a free slot's columns before it is used. So the bucketed step is only valid when
  `rows` is the whole running batch (the engine's bisection over a failing batch decodes eagerly).
- the attended length rounded up to a multiple of `length_quantum` (capped at the cache's capacity). The
  extra columns are masked like every column past a row's length in the eager step, so each real row's
  logits are the eager step's.

Each bucket's graph is captured on its first use (one eager warm-up on a side stream, then the capture);
all graphs share one memory pool, and the number of graphs is bounded by (row buckets) x (capacity /
length_quantum). The graphs hold the addresses of the weights and the cache: they are dropped when either
moves (growth of the cache, sleep and wake) and captured again on next use. A weight update copies into
the same tensors, so the graphs see it.

With the runner recording MoE routing (`routing_record`), the stacked top-k indices of the step are an
output of the graph like the logits: recorded inside the graph, rewritten by each replay, and handed on as
`last_routing`. A recorder switched on or off after a capture needs `reset()` (the engine does it).

Without `capture` (or off CUDA) the same bucketed step runs eagerly: that is what the CPU tests check
against the eager step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from quartet.rollout.torch.kv_cache import SlotKVCache
from quartet.rollout.torch.model_runner import DecoderRunner

__all__ = ["BucketedDecoder", "row_buckets"]

LENGTH_QUANTUM = 256


def row_buckets(num_slots: int) -> tuple[int, ...]:
    """Powers of two below `num_slots`, then `num_slots` itself: the batch sizes a step is padded to."""
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")
    sizes, size = [], 1
    while size < num_slots:
        sizes.append(size)
        size *= 2
    return (*sizes, num_slots)


@dataclass
class _Bucket:
    """Static inputs and output of one (rows, length) shape, and its graph once captured."""

    tokens: torch.Tensor  # [R] int64
    lengths: torch.Tensor  # [R] int64
    logits: torch.Tensor | None = None  # [R, V], written by each run or replay
    routing: torch.Tensor | None = None  # [R, L, k] top-k experts, written likewise (when recording)
    graph: torch.cuda.CUDAGraph | None = None


class BucketedDecoder:
    """The decode step of a `DecoderRunner` at bucketed shapes, from CUDA graphs where `capture` is set."""

    def __init__(
        self,
        runner: DecoderRunner,
        num_slots: int,
        *,
        capture: bool,
        length_quantum: int = LENGTH_QUANTUM,
    ) -> None:
        if length_quantum < 1:
            raise ValueError(f"length_quantum must be >= 1, got {length_quantum}")
        self.runner = runner
        self.num_slots = num_slots
        self.capture = capture
        self.length_quantum = length_quantum
        self.row_buckets = row_buckets(num_slots)
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._addresses: tuple[int, ...] = ()
        params = list(runner.model.parameters())
        self._watched = (params[0], params[-1])  # `.to()` moves every parameter's data: these two tell
        self._pool: Any = None  # the first graph's memory pool handle, shared by the others
        self.captures = 0
        """Graphs captured so far (every bucket's first use, again after the cache or weights moved)."""
        self.capture_seconds = 0.0
        """Wall time spent in warm-ups and captures."""
        self.last_routing: torch.Tensor | None = None
        """The last step's MoE routing [rows, L, k] when the runner records it (else None)."""

    def shape(self, rows: int, max_length: int, capacity: int) -> tuple[int, int]:
        """The (rows, attended length) bucket a step of `rows` rows and `max_length` columns runs at."""
        if not 1 <= rows <= self.num_slots:
            raise ValueError(f"rows must be in [1, {self.num_slots}], got {rows}")
        if max_length > capacity:
            raise ValueError(f"max_length {max_length} exceeds the cache's capacity {capacity}")
        padded_rows = next(b for b in self.row_buckets if b >= rows)
        quantum = self.length_quantum
        return padded_rows, min(capacity, -(-max_length // quantum) * quantum)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """The (rows, length) buckets that hold buffers (and, when capturing, a graph) now."""
        return sorted(self._buckets)

    def reset(self) -> None:
        """Drop every graph and buffer (their memory pool goes with them)."""
        self._buckets.clear()
        self._pool = None
        self._addresses = ()

    def decode(
        self, tokens: torch.Tensor, lengths: torch.Tensor, max_length: int, cache: SlotKVCache
    ) -> torch.Tensor:
        """`DecoderRunner.decode` for the whole running batch (slots 0..rows-1): logits [rows, V]."""
        rows = int(tokens.shape[0])
        self._forget_moved(cache)
        key = self.shape(rows, max_length, cache.capacity)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(
                torch.zeros(key[0], dtype=torch.long, device=tokens.device),
                torch.zeros(key[0], dtype=torch.long, device=tokens.device),
            )
        bucket.tokens[:rows].copy_(tokens)
        bucket.tokens[rows:].zero_()
        bucket.lengths[:rows].copy_(lengths)
        bucket.lengths[rows:].zero_()
        graphs = self.capture and tokens.device.type == "cuda"
        if not graphs:
            bucket.logits = self.runner.decode(bucket.tokens, bucket.lengths, key[1], cache)
            bucket.routing = self.runner.last_routing
        elif bucket.graph is None:
            self._capture(bucket, key[1], cache)
        else:
            bucket.graph.replay()
        assert bucket.logits is not None
        # clones: the next replay of a graph sharing the pool may reuse the memory
        self.last_routing = None if bucket.routing is None else bucket.routing[:rows].clone()
        return bucket.logits[:rows].clone()

    def _forget_moved(self, cache: SlotKVCache) -> None:
        first, last = self._watched
        addresses = (
            cache.keys[0].data_ptr(),
            cache.values[-1].data_ptr(),
            cache.capacity,
            first.data_ptr(),
            last.data_ptr(),
        )
        if addresses != self._addresses:
            self.reset()
            self._addresses = addresses

    def _capture(self, bucket: _Bucket, length: int, cache: SlotKVCache) -> None:
        """Warm the step up on a side stream (its writes equal the replay's), then record it."""
        start = time.perf_counter()
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.runner.decode(bucket.tokens, bucket.lengths, length, cache)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine steps on its own thread while a trainer may use the device.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            bucket.logits = self.runner.decode(bucket.tokens, bucket.lengths, length, cache)
            bucket.routing = self.runner.last_routing  # the graph's own output tensor (or None)
        if self._pool is None:
            self._pool = graph.pool()
        bucket.graph = graph
        graph.replay()
        self.captures += 1
        self.capture_seconds += time.perf_counter() - start
