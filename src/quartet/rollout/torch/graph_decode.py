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

The sampler can run inside the graph too (`decode_sampled`): the step's per-row temperature, top-k, top-p
and uniform are copied into the bucket's static inputs before the replay, and the graph writes each row's
token and log-prob, so no [rows, V] logits leave it and the sampler's kernels launch with the rest. A bucket
that samples is keyed by the sampler's host flags (greedy rows, filters) as well, because those choose its
kernels. Padded rows sample with row 0's parameters (the flags stay the real rows'), and their tokens are
dropped. The engine samples inside for a batch without penalties, grammars or top log-probs, which need the
logits on the host's side of the step.

Without `capture` (or off CUDA) the same bucketed step runs eagerly: that is what the CPU tests check
against the eager step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from quartet.rollout.torch.kv_cache import SlotKVCache
from quartet.rollout.torch.model_runner import DecoderRunner
from quartet.rollout.torch.sampling import RowSampling

SampleFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
"""`sample(logits, rows, uniforms)` -> (tokens, log-probs): `sampling.sample_next` or the fused kernel."""

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
class _SamplerBuffers:
    """The static sampler inputs of a bucket that samples inside its step, and its outputs."""

    rows: RowSampling  # [R] temperature, top-k, top-p, and the host flags the bucket is keyed by
    uniforms: torch.Tensor  # [R, K] float32: each row's uniform for each of the K steps
    tokens: torch.Tensor | None = None  # [R, K] int64, written by each run or replay
    logprobs: torch.Tensor | None = None  # [R, K] float32


@dataclass
class _Bucket:
    """Static inputs and output of one (rows, length) shape, and its graph once captured."""

    tokens: torch.Tensor  # [R] int64
    lengths: torch.Tensor  # [R] int64
    logits: torch.Tensor | None = None  # [R, V], written by each run or replay
    routing: torch.Tensor | None = None  # [R, L, k] top-k experts, written likewise (when recording)
    graph: torch.cuda.CUDAGraph | None = None
    sampler: _SamplerBuffers | None = None  # set when the step samples inside


def _sampler_buffers(rows: RowSampling, size: int, steps: int, device: torch.device) -> _SamplerBuffers:
    """Static sampler inputs of `size` rows with the host flags of `rows`, and `steps` uniforms a row."""
    static = RowSampling(
        temperature=torch.zeros(size, dtype=torch.float32, device=device),
        top_k=torch.zeros(size, dtype=torch.long, device=device),
        top_p=torch.ones(size, dtype=torch.float32, device=device),
        any_filter=rows.any_filter,
        any_greedy=rows.any_greedy,
        all_greedy=rows.all_greedy,
    )
    return _SamplerBuffers(static, torch.zeros(size, steps, dtype=torch.float32, device=device))


def _padded_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[:n] = src; the rows past n repeat src[0] (a padded row samples as row 0 does)."""
    n = int(src.shape[0])
    dst[:n].copy_(src)
    dst[n:].copy_(src[:1].expand(dst.shape[0] - n, *src.shape[1:]))


class BucketedDecoder:
    """The decode step of a `DecoderRunner` at bucketed shapes, from CUDA graphs where `capture` is set."""

    def __init__(
        self,
        runner: DecoderRunner,
        num_slots: int,
        *,
        capture: bool,
        length_quantum: int = LENGTH_QUANTUM,
        sample_inside: bool = True,
        steps_per_replay: int = 1,
    ) -> None:
        """`sample_inside`: the engine samples a plain batch inside the step (`decode_sampled`); False keeps
        the sampler outside, after the logits come out. `steps_per_replay` > 1: the engine decodes a plain
        batch that many tokens per step (`decode_steps`), one replay for all of them."""
        if steps_per_replay < 1:
            raise ValueError(f"steps_per_replay must be >= 1, got {steps_per_replay}")
        if length_quantum < 1:
            raise ValueError(f"length_quantum must be >= 1, got {length_quantum}")
        self.runner = runner
        self.num_slots = num_slots
        self.capture = capture
        self.length_quantum = length_quantum
        self.sample_inside = sample_inside
        self.steps_per_replay = steps_per_replay
        self.row_buckets = row_buckets(num_slots)
        self._buckets: dict[tuple[Any, ...], _Bucket] = {}
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
        return sorted({key[:2] for key in self._buckets})

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
        bucket, length = self._bucket(tokens, lengths, max_length, cache, ())

        def step() -> None:
            bucket.logits = self.runner.decode(bucket.tokens, bucket.lengths, length, cache)
            bucket.routing = self.runner.last_routing  # the graph's own output tensor (or None)

        self._run(bucket, step)
        assert bucket.logits is not None
        # clones: the next replay of a graph sharing the pool may reuse the memory
        self.last_routing = None if bucket.routing is None else bucket.routing[:rows].clone()
        return bucket.logits[:rows].clone()

    def decode_sampled(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        max_length: int,
        cache: SlotKVCache,
        rows: RowSampling,
        uniforms: torch.Tensor,
        sample: SampleFn,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`decode`, then `sample(logits, rows, uniforms)` in the same step (and graph): the tokens [rows]
        int64 and their log-probs [rows] float32 of the whole running batch. `rows` and `uniforms` are the
        running rows' (`SlotTable.sampling_rows`, `next_uniforms`); `sample` must launch the same kernels
        for the same host flags every time (`sampling.sample_next` or the fused sampler)."""
        got = self.decode_steps(tokens, lengths, max_length, cache, rows, uniforms.unsqueeze(1), sample)
        return got[0][:, 0], got[1][:, 0]

    def decode_steps(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        max_length: int,
        cache: SlotKVCache,
        rows: RowSampling,
        uniforms: torch.Tensor,
        sample: SampleFn,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K = uniforms.shape[1] decode-and-sample steps in one (each token fed to the next step on the
        device): tokens [rows, K] and log-probs [rows, K]. Every row writes K cache columns from its
        length on, so `max_length + K - 1` must fit the cache; the caller drops what a row sampled after
        it stopped. uniforms [rows, K]: each row's next K uniforms."""
        n, steps = int(tokens.shape[0]), int(uniforms.shape[1])
        flags = (rows.any_filter, rows.any_greedy, rows.all_greedy, steps)
        bucket, length = self._bucket(tokens, lengths, max_length + steps - 1, cache, flags)
        if bucket.sampler is None:
            bucket.sampler = _sampler_buffers(rows, int(bucket.tokens.shape[0]), steps, tokens.device)
        buffers = bucket.sampler
        _padded_copy(buffers.rows.temperature, rows.temperature)
        _padded_copy(buffers.rows.top_k, rows.top_k)
        _padded_copy(buffers.rows.top_p, rows.top_p)
        _padded_copy(buffers.uniforms, uniforms)
        fed, at = torch.empty_like(bucket.tokens), torch.empty_like(bucket.lengths)

        def step() -> None:
            fed.copy_(bucket.tokens)  # the inputs stay as given: a warm-up, a capture and a replay agree
            at.copy_(bucket.lengths)
            chosen, logprobs = [], []
            for j in range(steps):
                logits = self.runner.decode(fed, at, length, cache)
                bucket.routing = self.runner.last_routing
                token, logprob = sample(logits, buffers.rows, buffers.uniforms[:, j])
                if logprob is None:
                    raise RuntimeError("the sampler returned no log-probs; decode_sampled needs them")
                chosen.append(token)
                logprobs.append(logprob)
                fed.copy_(token)
                at.add_(1)
            buffers.tokens = torch.stack(chosen, 1)
            buffers.logprobs = torch.stack(logprobs, 1)

        self._run(bucket, step)
        assert buffers.tokens is not None and buffers.logprobs is not None
        self.last_routing = None if bucket.routing is None else bucket.routing[:n].clone()
        return buffers.tokens[:n].clone(), buffers.logprobs[:n].clone()

    def _bucket(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        max_length: int,
        cache: SlotKVCache,
        mode: tuple[bool | int, ...],
    ) -> tuple[_Bucket, int]:
        """The bucket of this step (made on first use), its token and length inputs filled; and the
        attended length it runs at. `mode`: () for logits out, the sampler's host flags when sampling."""
        rows = int(tokens.shape[0])
        self._forget_moved(cache)
        padded_rows, length = self.shape(rows, max_length, cache.capacity)
        key = (padded_rows, length, *mode)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(
                torch.zeros(padded_rows, dtype=torch.long, device=tokens.device),
                torch.zeros(padded_rows, dtype=torch.long, device=tokens.device),
            )
        bucket.tokens[:rows].copy_(tokens)
        bucket.tokens[rows:].zero_()
        bucket.lengths[:rows].copy_(lengths)
        bucket.lengths[rows:].zero_()
        return bucket, length

    def _run(self, bucket: _Bucket, step: Callable[[], None]) -> None:
        """The bucket's step: eagerly off CUDA (or without `capture`), else captured once, then replayed."""
        graphs = self.capture and bucket.tokens.device.type == "cuda"
        if not graphs:
            step()
        elif bucket.graph is None:
            self._capture(bucket, step)
        else:
            bucket.graph.replay()

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

    def _capture(self, bucket: _Bucket, step: Callable[[], None]) -> None:
        """Warm the step up on a side stream (its writes equal the replay's), then record it."""
        start = time.perf_counter()
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine steps on its own thread while a trainer may use the device.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            step()  # its outputs are now the graph's own tensors, rewritten by each replay
        if self._pool is None:
            self._pool = graph.pool()
        bucket.graph = graph
        graph.replay()
        self.captures += 1
        self.capture_seconds += time.perf_counter() - start
