"""Sampling from a causal LM for the Tinker service: `sample` is pure over a torch module and its inputs.

The caller chooses the module (a base model, or a peft model with the right adapter active or adapters
disabled) and runs `sample` on that module's own thread, so sampling never races its training. One call
samples `num_samples` continuations of one prompt in one batch: the prompt is prefilled once (batch 1,
which also gives the prompt logprobs), its KV cache (the model's own `past_key_values`) is repeated for
every sample, and each decode step is one forward over the samples still running; finished samples leave
the cache (`batch_select_indices`).

Token choice reuses the built-in rollout engine's sampler (`quartet.rollout.torch.sampling`): per sample a
stream of uniforms drawn up front from a `torch.Generator` seeded by (request seed, sample index), and the
token is the inverse CDF of softmax(logits / T) truncated by top-k then top-p. So the same seed gives the
same samples whatever else runs in the process (no global RNG is read), and sample i does not depend on
how many other samples share its batch (up to float rounding in the batched logits).

Logprobs, as the hosted Tinker service returns them (its maintainers' statement in tinker-cookbook PR 86:
"the same logprobs used for sampling, even when temperature scaling is applied"): a sampled token's logprob
is log_softmax(logits / T) at that token, before top-k/top-p truncation; greedy (T below 1e-5, 0
included) takes it at T = 1. Prompt logprobs (`compute_logprobs`, `include_prompt_logprobs`) and their
top-k are the model's own log_softmax(logits) (T = 1 whatever the request's temperature:
`compute_logprobs` has no temperature).

Stops: a token in `stop_token_ids` ends a sample and is returned as its last token (the Tinker cookbook's
renderers expect the stop token at the end). A stop string needs `decode` (the tokenizer's decode): after
each token the tail of the sample's tokens is decoded (4 tokens per character of the longest string, as the
rollout engine's `StopChecker` does) and a sample whose tail contains a stop string ends there; the tokens
that completed the string are returned (the text is not cut). Otherwise `max_tokens` ends it ("length").
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from torch import nn

from quartet.rollout.torch.sampling import RowSampling, draw_uniforms, sample_next, sample_seed, top_logprobs

__all__ = [
    "SampleParams",
    "SampleResult",
    "SampledSequence",
    "TopK",
    "context_length",
    "eos_token_ids",
    "sample",
    "vocab_size",
]

StopReason = Literal["stop", "length"]
GREEDY_BELOW = 1e-5
"""Temperatures below this sample greedily (vLLM's rule): logits / T would overflow float32 near 0."""


@dataclasses.dataclass(frozen=True)
class SampleParams:
    """What one sample request asks for (already validated; see `sample_wire`).

    max_tokens: most tokens per sample (>= 1). temperature: below `GREEDY_BELOW` (0 too) = greedy.
    top_k: <= 0 = off. top_p: 1 = off.
    stop_token_ids: ids that end a sample (the caller adds the model's EOS ids when the request keeps them).
    stop_strings: texts that end a sample (need `decode`). seed: None = a fresh random seed per call.
    """

    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class TopK:
    """The k most likely tokens at each of n positions: ids [n, k] int64 and logprobs [n, k] float32.

    A row with no distribution (prompt position 0) holds id 0 and logprob -inf in every column.
    """

    ids: torch.Tensor
    logprobs: torch.Tensor


@dataclasses.dataclass(frozen=True)
class SampledSequence:
    """One sample: its tokens, each token's logprob (see the module docstring) and why it ended."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason
    topk: TopK | None = None


@dataclasses.dataclass(frozen=True)
class SampleResult:
    """The samples, and the prompt's logprobs [P] float32 (NaN where not computed) and top-k when asked."""

    sequences: list[SampledSequence]
    prompt_logprobs: torch.Tensor | None = None
    prompt_topk: TopK | None = None


def vocab_size(module: nn.Module) -> int:
    """Rows of the output head: the token ids the model can score are [0, vocab_size)."""
    head: Any = module.get_output_embeddings()  # type: ignore[operator]
    return int(head.weight.shape[0])


def context_length(module: nn.Module) -> int | None:
    """The model's longest sequence (prompt + sampled tokens), from its config; None when it names none."""
    value = getattr(getattr(module, "config", None), "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None


def eos_token_ids(module: nn.Module) -> frozenset[int]:
    """The model's end-of-sequence ids (config and generation config; an int or a list in either)."""
    ids: set[int] = set()
    for source in (getattr(module, "config", None), getattr(module, "generation_config", None)):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return frozenset(ids)


@contextlib.contextmanager
def _inference(module: nn.Module) -> Iterator[None]:
    """No autograd, dropout off; the module's train/eval mode is restored after (a training model)."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was_training)


def _rows(params: SampleParams, n: int, device: torch.device) -> RowSampling:
    """The rollout sampler's per-row parameters, the same for all n rows of one request."""
    greedy = params.temperature < GREEDY_BELOW
    top_k = params.top_k if params.top_k > 0 else 0
    return RowSampling(
        temperature=torch.full((n,), 0.0 if greedy else float(params.temperature), device=device),
        top_k=torch.full((n,), top_k, dtype=torch.int64, device=device),
        top_p=torch.full((n,), float(params.top_p), device=device),
        any_filter=not greedy and (top_k > 0 or params.top_p < 1.0),
        any_greedy=greedy,
        all_greedy=greedy,
    )


def _prompt_scores(
    logits: torch.Tensor, prompt: torch.Tensor, want_logprobs: bool, topk: int, last_n: int | None
) -> tuple[torch.Tensor | None, TopK | None]:
    """Logprobs [P] of each prompt token under the model (T = 1) and the top-k [P, k] at each position.

    Position 0 has no distribution (NaN; a top-k row of id 0 / -inf); with `last_n`, only the last n
    positions are scored and earlier ones are NaN / empty rows likewise.
    """
    n = prompt.numel()
    log_probs = torch.log_softmax(logits[:-1].float(), dim=-1)  # row i predicts prompt[i + 1]
    first = 1 if last_n is None else n - last_n
    scored = torch.zeros(n, dtype=torch.bool, device=prompt.device)
    scored[first:] = True
    values = None
    if want_logprobs:
        values = torch.full((n,), math.nan, dtype=torch.float32, device=prompt.device)
        values[1:] = log_probs.gather(1, prompt[1:, None])[:, 0]
        values[~scored] = math.nan
    top = None
    if topk > 0:
        k = min(topk, log_probs.shape[-1])
        ids = torch.zeros((n, k), dtype=torch.int64, device=prompt.device)
        lps = torch.full((n, k), -math.inf, dtype=torch.float32, device=prompt.device)
        best, best_ids = log_probs.topk(k, dim=-1)
        ids[1:], lps[1:] = best_ids, best
        ids[~scored], lps[~scored] = 0, -math.inf
        top = TopK(ids.cpu(), lps.cpu())
    return (None if values is None else values.cpu()), top


class _Stops:
    """Decides after each token whether a sample has ended, and why."""

    def __init__(self, params: SampleParams, decode: Callable[[Sequence[int]], str] | None) -> None:
        if params.stop_strings and decode is None:
            raise ValueError("stop strings need a tokenizer (decode); give one or stop on token ids")
        self.ids = params.stop_token_ids
        self.strings = params.stop_strings
        self.decode = decode
        self.window = 4 * max((len(s) for s in self.strings), default=0) + 1
        self.max_tokens = params.max_tokens

    def reason(self, tokens: list[int]) -> StopReason | None:
        if tokens[-1] in self.ids:
            return "stop"
        if self.strings and self.decode is not None:
            tail = self.decode(tokens[-self.window :])
            if any(s in tail for s in self.strings):
                return "stop"
        return "length" if len(tokens) >= self.max_tokens else None


class _Samples:
    """The growing samples of one request: tokens, logprobs, top-k rows and stop reasons per sample."""

    def __init__(self, n: int, stops: _Stops, topk: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.tops: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(n)]
        self.reasons: list[StopReason | None] = [None] * n
        self.stops = stops
        self.topk = topk

    def step(
        self, active: list[int], logits: torch.Tensor, rows: RowSampling, uniforms: torch.Tensor
    ) -> torch.Tensor:
        """Sample one token for each active sample (rows of `logits`); returns the tokens [A]."""
        chosen, chosen_lp = sample_next(logits, rows, uniforms)
        assert chosen_lp is not None
        if self.topk > 0:
            top_lp, top_ids = top_logprobs(logits, rows.temperature, self.topk)
        for row, index in enumerate(active):
            self.tokens[index].append(int(chosen[row]))
            self.logprobs[index].append(float(chosen_lp[row]))
            if self.topk > 0:
                self.tops[index].append((top_ids[row].cpu(), top_lp[row].cpu()))
            self.reasons[index] = self.stops.reason(self.tokens[index])
        return chosen

    def sequences(self) -> list[SampledSequence]:
        out = []
        for tokens, logprobs, tops, reason in zip(
            self.tokens, self.logprobs, self.tops, self.reasons, strict=True
        ):
            topk = (
                TopK(torch.stack([t[0] for t in tops]), torch.stack([t[1] for t in tops])) if tops else None
            )
            assert reason is not None  # the last step sets "length" at the latest
            out.append(SampledSequence(tokens, logprobs, reason, topk))
        return out


def _decode(
    module: nn.Module, out: Any, params: SampleParams, uniforms: torch.Tensor, samples: _Samples
) -> None:
    """Decode from the prefill's output `out` (batch 1) until every sample has stopped: the prompt's cache is
    repeated per sample, and a stopped sample's row leaves it, so each forward runs the live samples only."""
    n, device = uniforms.shape[0], uniforms.device
    cache = out.past_key_values
    if n > 1:
        cache.batch_repeat_interleave(n)
    logits = out.logits[:, -1].float().expand(n, -1)
    active = list(range(n))  # the samples still running, in cache row order
    for step in range(params.max_tokens):
        chosen = samples.step(active, logits, _rows(params, len(active), device), uniforms[active, step])
        keep = [row for row, index in enumerate(active) if samples.reasons[index] is None]
        if not keep:
            return
        if len(keep) < len(active):
            cache.batch_select_indices(torch.tensor(keep, device=device))
            chosen = chosen[keep]
            active = [active[row] for row in keep]
        logits = (
            module(input_ids=chosen[:, None], past_key_values=cache, use_cache=True).logits[:, -1].float()
        )


def sample(
    module: nn.Module,
    prompt_tokens: Sequence[int],
    params: SampleParams,
    num_samples: int,
    *,
    decode: Callable[[Sequence[int]], str] | None = None,
    prompt_logprobs: bool = False,
    topk_prompt_logprobs: int = 0,
    topk_sample_logprobs: int = 0,
    prompt_logprobs_last_n: int | None = None,
) -> SampleResult:
    """`num_samples` continuations of `prompt_tokens` from `module` (a transformers causal LM or a peft one).

    Pure but for the module's forward: no global RNG is read or advanced, the module's mode is restored.
    `decode` (token ids -> text) is needed only for stop strings. The prompt's logprobs and top-k are
    computed in the same prefill when asked for (see `SampleResult`). Inputs are assumed validated (ids in
    the vocabulary, prompt + max_tokens within the context): `sample_wire` checks a request first.
    """
    if num_samples < 1 or params.max_tokens < 1 or not prompt_tokens:
        raise ValueError("sample needs num_samples >= 1, max_tokens >= 1 and a non-empty prompt")
    from transformers import DynamicCache  # the service runs with transformers; `quartet` imports stay light

    samples = _Samples(num_samples, _Stops(params, decode), topk_sample_logprobs)
    device = next(module.parameters()).device
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    uniforms = torch.stack(
        [draw_uniforms(sample_seed(seed, i), params.max_tokens) for i in range(num_samples)]
    ).to(device)
    prompt = torch.as_tensor(list(prompt_tokens), dtype=torch.int64, device=device)
    with _inference(module):
        out = module(input_ids=prompt[None], past_key_values=DynamicCache(), use_cache=True)
        prompt_values, prompt_top = _prompt_scores(
            out.logits[0], prompt, prompt_logprobs, topk_prompt_logprobs, prompt_logprobs_last_n
        )
        _decode(module, out, params, uniforms, samples)
    return SampleResult(samples.sequences(), prompt_values, prompt_top)
