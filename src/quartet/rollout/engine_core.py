"""The single-threaded heart of the built-in engine: continuous batching over a slot KV cache.

One `step()`:
1. decode: every running sequence (slots 0..A-1) gets one token; finished ones leave and the batch is
   compacted (the last running slots move into the holes, so running slots stay contiguous);
2. admit: waiting groups fill the free slots (first come, first served); each group's prompt is prefilled
   once, its keys/values are copied into the slots of all its samples, and each sample draws its first
   token from the shared next-token distribution; those finishing at once leave again.
So a short request leaves the batch as soon as it is done and a waiting one takes its slot at the next step,
however long the other running sequences are.

Nothing here is thread-safe; `TorchRolloutEngine` serialises calls.
"""

from __future__ import annotations

import itertools
import random

import torch

from quartet.rollout.kv_cache import SlotKVCache
from quartet.rollout.model_runner import DecoderRunner
from quartet.rollout.sampling import sample_next, sample_seed
from quartet.rollout.scheduler import Scheduler, split_into_groups
from quartet.rollout.sequence import SequenceGroup, SequenceState
from quartet.rollout.slot_table import SlotTable
from quartet.rollout.stopping import StopChecker
from quartet.rollout.types import FinishReason, GenerationRequest

__all__ = ["EngineCore"]


class EngineCore:
    """Waiting and running sequences, the KV cache, and the step that advances them."""

    def __init__(
        self,
        runner: DecoderRunner,
        stop_checker: StopChecker,
        *,
        max_num_seqs: int,
        max_model_len: int,
        max_prefill_tokens: int,
        seed: int,
    ) -> None:
        self.runner = runner
        self.stop_checker = stop_checker
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.scheduler = Scheduler(max_prefill_tokens)
        self.cache: SlotKVCache = runner.new_cache(max_num_seqs)
        self.table: SlotTable | None = None
        self.running: list[SequenceState] = []  # running[i] occupies slot i
        self.steps = 0
        self._seed_rng = random.Random(seed)  # seeds of requests that bring none
        self._counter = itertools.count()

    # ---- requests ---------------------------------------------------------------------------------------

    def add(self, request: GenerationRequest) -> list[SequenceState]:
        """Queue the request's `n` samples; returns their states (they finish in place)."""
        params = request.sampling
        self.stop_checker.validate(params)
        prompt_len = len(request.prompt_token_ids)
        if prompt_len >= self.max_model_len:
            raise ValueError(
                f"request {request.request_id}: prompt of {prompt_len} tokens leaves no room in the model's "
                f"context of {self.max_model_len}"
            )
        base_seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(62)
        stop_ids = self.stop_checker.stop_ids(params)
        max_new = min(params.max_new_tokens, self.max_model_len - prompt_len)
        seqs = [
            SequenceState(request, j, sample_seed(base_seed, j), max_new, stop_ids) for j in range(params.n)
        ]
        self.scheduler.add(split_into_groups(seqs, self.max_num_seqs))
        return seqs

    def has_work(self) -> bool:
        """True while sequences wait or run."""
        return bool(self.running) or len(self.scheduler) > 0

    def abort(self, request_id: str) -> list[SequenceState]:
        """Finish (ABORT) every waiting or running sample of `request_id`; returns those finished now."""
        done: list[SequenceState] = []
        for group in self.scheduler.abort(request_id):
            for seq in group.sequences:
                seq.finish(FinishReason.ABORT, self.steps)
                done.append(seq)
        for seq in self.running:
            if seq.request.request_id == request_id and not seq.finished:
                seq.finish(FinishReason.ABORT, self.steps)
        return done + self._retire()

    def abort_all(self) -> list[SequenceState]:
        """Abort everything (shutdown, or after an error left the batch in an unknown state)."""
        ids = {g.request.request_id for g in self.scheduler.waiting}
        ids |= {s.request.request_id for s in self.running}
        return [seq for rid in sorted(ids) for seq in self.abort(rid)]

    # ---- memory -----------------------------------------------------------------------------------------

    def free_cache(self) -> None:
        """Release the KV cache and slot table (only while nothing runs)."""
        if self.running:
            raise RuntimeError("cannot free the KV cache while sequences are running")
        self.cache.free()
        self.table = None

    def _ensure_memory(self, groups: list[SequenceGroup]) -> SlotTable:
        if self.table is None or self.cache.device != self.runner.device:
            self.cache = self.runner.new_cache(self.max_num_seqs)
            self.table = SlotTable(self.max_num_seqs, self.runner.device)
        need = max(g.prompt_len + s.max_new_tokens for g in groups for s in g.sequences)
        used = max((s.cached_len + 1 for s in self.running), default=0)
        self.cache.ensure_capacity(need, used)
        return self.table

    # ---- the step ---------------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[SequenceState]:
        """Advance every running sequence by one token and admit waiting ones; returns those finished."""
        self.steps += 1
        finished: list[SequenceState] = []
        if self.running:
            self._decode()
            finished += self._retire()
        groups = self.scheduler.admit(self.max_num_seqs - len(self.running))
        if groups:
            self._prefill(groups)
            finished += self._retire()
        return finished

    def _decode(self) -> None:
        table = self.table
        assert table is not None  # running sequences imply allocated memory
        rows = len(self.running)
        longest = max(s.cached_len for s in self.running) + 1
        logits = self.runner.decode(table.last_token[:rows], table.cached_len[:rows], longest, self.cache)
        tokens, logprobs = sample_next(
            logits, table.sampling_rows(0, rows, self.running), table.next_uniforms(0, rows)
        )
        table.record(0, tokens, fed=True)
        self._append(self.running, tokens, logprobs)

    def _prefill(self, groups: list[SequenceGroup]) -> None:
        table = self._ensure_memory(groups)
        device = self.runner.device
        start = len(self.running)
        seqs = [s for g in groups for s in g.sequences]
        longest = max(g.prompt_len for g in groups)
        ids = torch.zeros(len(groups), longest, dtype=torch.long)
        for i, g in enumerate(groups):
            ids[i, : g.prompt_len] = torch.tensor(g.request.prompt_token_ids)
        lengths = torch.tensor([g.prompt_len for g in groups])
        expand: torch.Tensor | None = None
        if len(seqs) != len(groups):
            expand = torch.tensor([i for i, g in enumerate(groups) for _ in g.sequences], device=device)
        table.assign(start, seqs)
        logits = self.runner.prefill(ids.to(device), lengths.to(device), self.cache, start, expand)
        if expand is not None:
            logits = logits.index_select(0, expand)
        stop = start + len(seqs)
        tokens, logprobs = sample_next(
            logits, table.sampling_rows(start, stop, seqs), table.next_uniforms(start, stop)
        )
        table.record(start, tokens, fed=False)
        for seq in seqs:
            seq.first_step = self.steps
        self.running.extend(seqs)
        self._append(seqs, tokens, logprobs)

    def _append(self, seqs: list[SequenceState], tokens: torch.Tensor, logprobs: torch.Tensor | None) -> None:
        """Give each sequence its new token (and log-prob) and check whether it stops."""
        token_list = tokens.tolist()
        lp_list = logprobs.tolist() if logprobs is not None else [0.0] * len(token_list)
        for seq, tok, lp in zip(seqs, token_list, lp_list, strict=True):
            seq.token_ids.append(tok)
            seq.logprobs.append(lp)
            self.stop_checker.check(seq, self.steps)

    def _retire(self) -> list[SequenceState]:
        """Remove finished sequences from the running batch, moving the last running ones into the holes."""
        done = [s for s in self.running if s.finished]
        if not done:
            return []
        keep = len(self.running) - len(done)
        holes = [i for i in range(keep) if self.running[i].finished]
        sources = [i for i in range(keep, len(self.running)) if not self.running[i].finished]
        if holes:
            assert self.table is not None
            length = max(self.running[i].cached_len for i in sources)
            self.cache.move(holes, sources, length)
            self.table.move(holes, sources)
            for h, s in zip(holes, sources, strict=True):
                self.running[h] = self.running[s]
        del self.running[keep:]
        return done
