"""The single-threaded heart of the built-in engine: continuous batching over a slot KV cache.

One `step()`:
1. decode: every running sequence (slots 0..A-1) gets one token; finished ones leave and the batch is
   compacted (the last running slots move into the holes, so running slots stay contiguous);
2. admit: waiting groups fill the free slots (first come, first served); each group's prompt is prefilled
   once, its keys/values are copied into the slots of all its samples, and each sample draws its first
   token from the shared next-token distribution; those finishing at once leave again.
So a short request leaves the batch as soon as it is done and a waiting one takes its slot at the next step,
however long the other running sequences are. Sampling masks the tokens a request's grammar forbids
(`grammar`, constrained decoding); rows of unconstrained requests are untouched.

One bad sequence fails alone. Requests are checked before they are queued (`check_request`); if a step
still raises, the step finds the sequence that makes it raise and fails its request only (the sequence's
`error` is set, its sibling samples are aborted), and the others go on in the same step:
- decode: bisection over prefixes of the running slots (slots 0..k-1 decode without touching the others;
  a retried forward rewrites the same cache column, so probing has no lasting effect). The first failing
  prefix ends with the culprit. Cost: about log2(A) extra forwards of at most A rows per failing sequence.
  This assumes the failure belongs to a row; a failure of the batch as a whole (out of memory) fails rows
  one by one from the end until the rest passes, and one that does not reproduce fails the last row.
- prefill: the admitted groups are prefilled again one at a time; a group that fails alone is failed.
- stop checks run per sequence.

MoE routing record (`DecoderRunner.record_routing`, docs/moe_routing_replay.md): each sequence keeps the
top-k experts of every token fed for it. A group's prompt is prefilled once and its [P, L, k] record is
shared by its samples (prefix sharing); each decode step appends one row per running sequence, from the
eager step or the CUDA graph (recorded inside it). There is no chunked prefill and no preemption here, so
every fed token is recorded exactly once; a retried forward (bisection of a failing step) keeps only the
record of the forward that succeeded.

Nothing here is thread-safe; `TorchRolloutEngine` serialises calls.
"""

from __future__ import annotations

import itertools
import logging
import random

import torch

from quartet.rollout.torch.grammar import (
    GrammarCompiler,
    advance_grammar,
    any_constrained,
    apply_grammar_masks,
)
from quartet.rollout.torch.graph_decode import BucketedDecoder, SampleFn
from quartet.rollout.torch.kv_cache import SlotKVCache
from quartet.rollout.torch.model_runner import DecoderRunner
from quartet.rollout.torch.penalties import apply_processing, build_processing
from quartet.rollout.torch.prompt_scores import score_prompt
from quartet.rollout.torch.sampling import sample_next, sample_seed, top_logprobs
from quartet.rollout.torch.scheduler import Scheduler, split_into_groups
from quartet.rollout.torch.sequence import SequenceGroup, SequenceState
from quartet.rollout.torch.slot_table import SlotTable
from quartet.rollout.torch.stopping import StopChecker
from quartet.rollout.torch.vision_prefill import vision_prefill
from quartet.rollout.types import FinishReason, GenerationRequest
from quartet.rollout.validation import InvalidRequestError, RequestLimits, check_request

_Sampled = tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor] | None]
"""Tokens [A], their log-probs [A] (or None) and the top log-probs and ids [A, k] (or None)."""

__all__ = ["EngineCore"]

log = logging.getLogger(__name__)


def _plain_sampling(seqs: list[SequenceState]) -> bool:
    """No row needs the logits on the host's side of the step: no penalty or `min_tokens`, no grammar, no
    top log-probs (the decoder may then sample inside its step)."""
    return not any_constrained(seqs) and not any(
        s.request.sampling.uses_penalties or s.request.sampling.top_logprobs > 0 for s in seqs
    )


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
        max_n: int | None = None,
        decoder: BucketedDecoder | None = None,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self.runner = runner
        self.grammars = grammars
        """Compiles `SamplingParams.grammar` (constrained decoding); None: grammars are refused."""
        self.decoder = decoder
        """Decodes the whole running batch at bucketed shapes (CUDA graphs); None: every step eagerly."""
        self.stop_checker = stop_checker
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_n = max_n
        self.scheduler = Scheduler(max_prefill_tokens)
        self.cache: SlotKVCache = runner.new_cache(max_num_seqs)
        self.table: SlotTable | None = None
        self.running: list[SequenceState] = []  # running[i] occupies slot i
        self.steps = 0
        self.weight_version = 0
        """Version of the weights the model holds (set by whoever loads them, between two steps); every
        generated token records it."""
        self._seed_rng = random.Random(seed)  # seeds of requests that bring none
        self._counter = itertools.count()
        self._aside: list[SequenceState] = []  # finished outside `running` (failed), returned by step()
        self._step_routing: torch.Tensor | None = None  # the last decode forward's routing (when recorded)

    # ---- requests ---------------------------------------------------------------------------------------

    def add(self, request: GenerationRequest) -> list[SequenceState]:
        """Queue the request's `n` samples; returns their states (they finish in place)."""
        params = request.sampling
        check_request(request, self.limits)
        self.stop_checker.validate(params)
        prompt_len = len(request.prompt_token_ids)
        base_seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(62)
        stop_ids = self.stop_checker.stop_ids(params)
        max_new = min(params.max_new_tokens, self.max_model_len - prompt_len)
        seqs = [
            SequenceState(request, j, sample_seed(base_seed, j), max_new, stop_ids) for j in range(params.n)
        ]
        if params.grammar is not None:
            if self.grammars is None:
                raise InvalidRequestError("grammar", "constrained decoding needs an engine with a tokenizer")
            for seq in seqs:
                seq.matcher = self.grammars.matcher(params.grammar)
        self.scheduler.add(split_into_groups(seqs, self.max_num_seqs))
        return seqs

    @property
    def limits(self) -> RequestLimits:
        """What a request must fit: the model's vocabulary and context, the cap on samples."""
        return RequestLimits(self.runner.vocab_size, self.max_model_len, self.max_n)

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
        if self.decoder is not None:
            self.decoder.reset()

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
        """Advance every running sequence by one token and admit waiting ones; returns those finished.

        Sequences failed by this step are among them, with `error` set.
        """
        self.steps += 1
        finished: list[SequenceState] = []
        if self.running:
            self._decode()
            finished += self._retire()
        groups = self.scheduler.admit(self.max_num_seqs - len(self.running))
        if groups:
            self._admit(groups)
            finished += self._retire()
        finished += self._aside
        self._aside = []
        return finished

    @property
    def records_routing(self) -> bool:
        """True when every sequence keeps its MoE routing (`SequenceState.routing`)."""
        return self.runner.recorder is not None

    def _decode(self) -> None:
        """One token for every running sequence (or the decoder's `steps_per_replay` tokens, where the batch
        allows it); a sequence whose decoding raises fails alone."""
        if self._block_fits():
            try:
                self._decode_block()
                return
            except Exception as exc:  # decoded again token by token, where a failing row is isolated
                log.debug("rollout: a multi-step decode failed (%r); one step instead", exc)
        while self.running:
            rows = len(self.running)
            try:
                tokens, logprobs, tops = self._decode_rows(rows)
            except Exception as exc:
                self._isolate(rows, exc)
                continue
            assert self.table is not None
            if self.records_routing:
                self._keep_routing(self._step_routing)
            self.table.record(0, tokens, fed=True)
            self._append(self.running, tokens, logprobs, tops)
            return

    def _block_fits(self) -> bool:
        """Several tokens per step: a decoder set for them, a batch that samples inside it (no penalties,
        grammars, top log-probs, routing records or image positions), and room in the cache for all."""
        decoder = self.decoder
        if decoder is None or decoder.steps_per_replay < 2 or not decoder.sample_inside:
            return False
        seqs = self.running
        if self.records_routing or any(s.rope_delta for s in seqs) or not _plain_sampling(seqs):
            return False
        return max(s.cached_len for s in seqs) + decoder.steps_per_replay <= self.cache.capacity

    def _decode_block(self) -> None:
        """`steps_per_replay` tokens for every running sequence in one decoder call; each sequence takes
        them in order until it stops, and drops the rest (their cache columns are past its end)."""
        decoder, table = self.decoder, self.table
        assert decoder is not None and table is not None
        seqs, steps = list(self.running), decoder.steps_per_replay
        rows = len(seqs)
        longest = max(s.cached_len for s in seqs) + 1
        tokens, logprobs = decoder.decode_steps(
            table.last_token[:rows],
            table.cached_len[:rows],
            longest,
            self.cache,
            table.sampling_rows(0, rows, seqs),
            table.next_uniforms_block(0, rows, steps),
            self._sample_fn,
        )
        table.record_block(0, tokens[:, -1], steps)
        token_rows = tokens.tolist()  # one copy to the host for the whole block
        logprob_rows = logprobs.tolist()
        for j in range(steps):
            live = [i for i, seq in enumerate(seqs) if not seq.finished]
            if not live:
                break
            column = [token_rows[i][j] for i in live]
            self._append_values([seqs[i] for i in live], column, [logprob_rows[i][j] for i in live])

    def _decode_rows(self, rows: int) -> _Sampled:
        """Forward and sample slots 0..rows-1 without recording (a repeat rewrites the same cache column)."""
        table = self.table
        assert table is not None  # running sequences imply allocated memory
        seqs = self.running[:rows]
        longest = max(s.cached_len for s in seqs) + 1
        tokens, lengths = table.last_token[:rows], table.cached_len[:rows]
        deltas = None  # M-RoPE offsets of image prompts: decoded eagerly (the graphs take plain positions)
        if any(s.rope_delta for s in seqs):
            deltas = torch.tensor([s.rope_delta for s in seqs], dtype=lengths.dtype, device=lengths.device)
        if self.decoder is not None and rows == len(self.running) and deltas is None:
            if self.decoder.sample_inside and _plain_sampling(seqs):  # the sampler inside the graph
                sampling, uniforms = table.sampling_rows(0, rows, seqs), table.next_uniforms(0, rows)
                sampled = self.decoder.decode_sampled(
                    tokens, lengths, longest, self.cache, sampling, uniforms, self._sample_fn
                )
                self._step_routing = self.decoder.last_routing
                return sampled[0], sampled[1], None
            logits = self.decoder.decode(tokens, lengths, longest, self.cache)  # padded rows: free slots
            self._step_routing = self.decoder.last_routing
        else:
            logits = self.runner.decode(tokens, lengths, longest, self.cache, deltas)
            self._step_routing = self.runner.last_routing
        return self._sample(logits, 0, seqs)

    def _keep_routing(self, routing: torch.Tensor | None) -> None:
        """Append the decode step's routing [>= A, L, k] row by row to the running sequences."""
        if routing is None:
            raise RuntimeError("the runner records routing but the decode step returned none")
        for i, seq in enumerate(self.running):
            assert seq.routing is not None
            seq.routing.append(routing[i : i + 1])

    def _isolate(self, rows: int, exc: Exception) -> None:
        """Fail the row that makes decoding slots 0..rows-1 raise: the last of the first failing prefix."""
        lo = 1
        hi = rows
        error = exc
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                self._decode_rows(mid)
            except Exception as probe_exc:
                hi, error = mid, probe_exc
            else:
                lo = mid + 1
        culprit = self.running[lo - 1]
        log.warning("rollout: request %s failed in decode: %r", culprit.request.request_id, error)
        self._fail(culprit, error)
        self._aside += self._retire()

    def _admit(self, groups: list[SequenceGroup]) -> None:
        """Prefill `groups`; if that raises, prefill them one at a time and fail those that raise alone."""
        try:
            self._prefill(groups)
        except Exception as exc:
            if len(groups) > 1:
                for group in groups:
                    self._admit([group])
                return
            log.warning("rollout: request %s failed in prefill: %r", groups[0].request.request_id, exc)
            for seq in groups[0].sequences:
                seq.finish(FinishReason.ABORT, self.steps)
                self._aside.append(seq)
            self._fail(groups[0].sequences[0], exc)

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
        ids, lengths = ids.to(device), lengths.to(device)
        vision = None
        if self.runner.vision is not None:
            trunk, embed = self.runner.vision, self.runner.base.embed_tokens
            vision = vision_prefill(trunk, embed, ids, lengths, [g.request for g in groups])
        if vision is not None:
            for group, delta in zip(groups, vision[1].tolist(), strict=True):
                for seq in group.sequences:
                    seq.rope_delta = int(delta)
        scored = [g for g in groups if g.request.prompt_logprobs is not None]
        logits = self.runner.prefill(
            ids, lengths, self.cache, start, expand, vision[0] if vision else None, keep_hidden=bool(scored)
        )
        if scored:
            self._score_prompts(groups)
        if self.records_routing:
            routing = self.runner.last_routing
            assert routing is not None
            routing = routing.view(len(groups), longest, *routing.shape[1:])
            for i, group in enumerate(groups):  # one record of the shared prompt for all its samples
                for seq in group.sequences:
                    seq.routing = [routing[i, : group.prompt_len]]
        if expand is not None:
            logits = logits.index_select(0, expand)
        tokens, logprobs, tops = self._sample(logits, start, seqs)
        table.record(start, tokens, fed=False)
        for seq in seqs:
            seq.first_step = self.steps
        self.running.extend(seqs)
        self._append(seqs, tokens, logprobs, tops)

    def _score_prompts(self, groups: list[SequenceGroup]) -> None:
        """Give the samples of each group that asks for them its prompt's log-probs (`prompt_scores`)."""
        hidden = self.runner.last_hidden
        assert hidden is not None
        self.runner.last_hidden = None
        for i, group in enumerate(groups):
            k = group.request.prompt_logprobs
            if k is None:
                continue
            scores = score_prompt(self.runner.head, hidden[i], group.request.prompt_token_ids, k)
            for seq in group.sequences:
                seq.prompt_logprobs = scores

    def _sample(self, logits: torch.Tensor, start: int, seqs: list[SequenceState]) -> _Sampled:
        """Process (penalties, `min_tokens`) and sample the logits [A, V] of slots start.., rows `seqs`."""
        assert self.table is not None
        stop = start + len(seqs)
        processing = build_processing(seqs, logits.shape[-1], logits.device)
        if processing is not None:
            logits = apply_processing(logits, processing)
        if any_constrained(seqs):
            logits = apply_grammar_masks(logits, seqs)
        rows = self.table.sampling_rows(start, stop, seqs)
        tokens, logprobs = self._sample_fn(logits, rows, self.table.next_uniforms(start, stop))
        k = max(s.request.sampling.top_logprobs for s in seqs)
        tops = top_logprobs(logits, rows.temperature, k) if k > 0 else None
        return tokens, logprobs, tops

    @property
    def _sample_fn(self) -> SampleFn:
        """The sampler: the fused kernel where the runner has it, else `sample_next`."""
        return sample_next if self.runner.kernels is None else self.runner.kernels.sample

    def _append(
        self,
        seqs: list[SequenceState],
        tokens: torch.Tensor,
        logprobs: torch.Tensor | None,
        tops: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> None:
        """Give each sequence its new token (and log-probs) and check whether it stops."""
        token_list = tokens.tolist()
        lp_list = logprobs.tolist() if logprobs is not None else [0.0] * len(token_list)
        tops_lists = (tops[0].tolist(), tops[1].tolist()) if tops is not None else None
        self._append_values(seqs, token_list, lp_list, tops_lists)

    def _append_values(
        self,
        seqs: list[SequenceState],
        token_list: list[int],
        lp_list: list[float],
        tops: tuple[list[list[float]], list[list[int]]] | None = None,
    ) -> None:
        """`_append` on host values: row i of each list is `seqs[i]`'s."""
        for i, (seq, tok, lp) in enumerate(zip(seqs, token_list, lp_list, strict=True)):
            seq.token_ids.append(tok)
            seq.logprobs.append(lp)
            seq.versions.append(self.weight_version)
            k = seq.request.sampling.top_logprobs
            if k > 0 and tops is not None:
                seq.top_logprobs.append(tuple(zip(tops[1][i][:k], tops[0][i][:k], strict=True)))
            try:
                complete = seq.matcher is not None and advance_grammar(seq)
                if (
                    complete and tok not in seq.stop_ids
                ):  # the grammar ended it, even on its last allowed token
                    seq.finish(FinishReason.STOP, self.steps)
                else:
                    self.stop_checker.check(seq, self.steps)
            except Exception as exc:
                log.warning("rollout: request %s failed its stop check: %r", seq.request.request_id, exc)
                self._fail(seq, exc)

    def _fail(self, seq: SequenceState, error: BaseException) -> None:
        """Fail `seq` with `error` and abort the other samples of its request (running or waiting)."""
        seq.error = error
        rid = seq.request.request_id
        if not seq.finished:
            seq.finish(FinishReason.ABORT, self.steps)
        for other in self.running:
            if other.request.request_id == rid and not other.finished:
                other.finish(FinishReason.ABORT, self.steps)
        for group in self.scheduler.abort(rid):
            for other in group.sequences:
                other.finish(FinishReason.ABORT, self.steps)
                self._aside.append(other)

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
