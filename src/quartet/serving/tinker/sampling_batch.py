"""Several sample requests, of several adapters of one base model, decoded as one batch: `sample_many`.

`sampling.sample` decodes one request (one prompt x n samples). A GRPO loop over the SDK sends many such
requests at once (8 prompts x 4 samples), often from several clients; run one after another they cost one
decode forward per request per token. `sample_many` takes them together:

1. Prefill: each request alone, with ITS adapter active (prompts differ in length), exactly as `sample`
   does: its prompt logprobs / top-k come from this forward, and its first token from the last position.
2. Decode: every running sample of every request in one forward per token. The requests' KV caches are
   joined: each request's cache is repeated for its samples and left-padded to the longest prompt; the
   padding is masked (`attention_mask` 0) and every row gets its own `position_ids` (its prompt length +
   tokens so far), so a row sees exactly what it saw alone. The rows' adapters differ: one forward runs
   them all through peft's mixed-batch LoRA (`adapter_names=[...]`, "__base__" for the bare base; peft
   applies each row's own LoRA to that row only, and works with `past_key_values`). When every row has
   the same adapter, that adapter is simply active.
3. Token choice: per request as `sample` chooses it (its `RowSampling`, its per-sample seeded uniforms
   `draw_uniforms(sample_seed(seed, i))`, its stops), on its rows of the batched logits; a finished
   sample leaves the batch (cache, mask, positions, adapter names).

So a request's samples equal what `sample` gives for it alone, up to float rounding in the batched logits
(the tests check tokens and logprobs against `sample` alone). A lone request simply runs `sample`. Caches
that are not plain growing caches (sliding-window layers) are not joined: such a request decodes alone
with `sample`'s own decode.

A request's own failure (an adapter that was unloaded, stop strings without a tokenizer) fails its slot
only; a failing batched forward fails every request of the batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from quartet.rollout.torch.sampling import draw_uniforms, sample_seed
from quartet.serving.tinker.adapters import BASE, AdapterHost
from quartet.serving.tinker.sampling import (
    SampleParams,
    SampleResult,
    TopK,
    _decode,
    _inference,
    _prompt_scores,
    _rows,
    _Samples,
    _Stops,
    sample,
)

__all__ = ["SampleRequest", "sample_many"]


@dataclasses.dataclass(frozen=True)
class SampleRequest:
    """One sample request, as `sampling.sample` takes it, and the adapter it samples (None: the base)."""

    adapter: str | None
    prompt: tuple[int, ...]
    params: SampleParams
    num_samples: int
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    prompt_logprobs_last_n: int | None = None


@dataclasses.dataclass
class _Running:
    """A prefilled request waiting to join the batched decode."""

    index: int  # its slot in the answer
    request: SampleRequest
    samples: _Samples
    uniforms: torch.Tensor  # [n, max_tokens]
    cache: Any  # its prompt's DynamicCache (batch 1)
    prompt_len: int
    prompt_values: torch.Tensor | None
    prompt_top: TopK | None

    def result(self) -> SampleResult:
        return SampleResult(self.samples.sequences(), self.prompt_values, self.prompt_top)


def sample_many(host: AdapterHost, requests: Sequence[SampleRequest]) -> list[SampleResult | Exception]:
    """One `SampleResult` per request, in order, decoding all of them together (module doc); a slot holds
    the exception of a request that failed on its own. Runs on the host's thread (not thread-safe)."""
    from transformers import DynamicCache

    if len(requests) == 1:  # nothing to batch with: `sample` itself, as before batching existed
        return [_alone(host, requests[0])]
    answers: list[SampleResult | Exception | None] = [None] * len(requests)
    by_adapter: dict[str | None, list[int]] = {}
    for index, request in enumerate(requests):
        try:
            _check(host, request)
        except Exception as err:  # this request's own failure: its slot only
            answers[index] = err
            continue
        by_adapter.setdefault(request.adapter, []).append(index)
    running: list[_Running] = []
    for adapter, indices in by_adapter.items():  # each adapter made active once, its requests prefilled
        with host.active(adapter) as module, _inference(module):
            for index in indices:
                try:
                    joined = _prefill(module, index, requests[index], DynamicCache, host.decode)
                except Exception as err:  # this request's own failure: its slot only
                    answers[index] = err
                    continue
                if isinstance(joined, _Running):
                    running.append(joined)
                else:
                    answers[index] = joined
    if running:
        _decode_together(host, running)
        for state in running:
            answers[state.index] = state.result()
    assert all(answer is not None for answer in answers)
    return [answer for answer in answers if answer is not None]


def _alone(host: AdapterHost, request: SampleRequest) -> SampleResult | Exception:
    """One request by `sampling.sample` (its own failure as the answer)."""
    try:
        _check(host, request)
        params = request.params
        with host.active(request.adapter) as module:
            return sample(
                module,
                request.prompt,
                params,
                request.num_samples,
                decode=host.decode if params.stop_strings else None,
                prompt_logprobs=request.prompt_logprobs,
                topk_prompt_logprobs=request.topk_prompt_logprobs,
                topk_sample_logprobs=request.topk_sample_logprobs,
                prompt_logprobs_last_n=request.prompt_logprobs_last_n,
            )
    except Exception as err:  # this request's own failure: its slot
        return err


def _check(host: AdapterHost, request: SampleRequest) -> None:
    if request.num_samples < 1 or request.params.max_tokens < 1 or not request.prompt:
        raise ValueError("sample needs num_samples >= 1, max_tokens >= 1 and a non-empty prompt")
    if request.adapter is not None and request.adapter != BASE and request.adapter not in host.names:
        raise KeyError(f"no adapter {request.adapter!r} on {host.model_path}: it was unloaded")


def _prefill(
    module: nn.Module,
    index: int,
    request: SampleRequest,
    cache_class: Callable[[], Any],
    text: Callable[[Sequence[int]], str],
) -> _Running | SampleResult:
    """The request's prompt forward through `module` (its adapter active, inference mode) and its first
    token, as `sample` does; a cache that cannot be joined is decoded here, alone (then the finished
    result is returned). `text` decodes token ids (stop strings)."""
    params, n = request.params, request.num_samples
    decode = text if params.stop_strings else None
    samples = _Samples(n, _Stops(params, decode), request.topk_sample_logprobs)
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    device = next(module.parameters()).device
    uniforms = torch.stack([draw_uniforms(sample_seed(seed, i), params.max_tokens) for i in range(n)]).to(
        device
    )
    prompt = torch.as_tensor(list(request.prompt), dtype=torch.int64, device=device)
    out = module(input_ids=prompt[None], past_key_values=cache_class(), use_cache=True)
    prompt_values, prompt_top = _prompt_scores(
        out.logits[0],
        prompt,
        request.prompt_logprobs,
        request.topk_prompt_logprobs,
        request.prompt_logprobs_last_n,
    )
    if not _joinable(out.past_key_values):
        _decode(module, out, params, uniforms, samples)
        return SampleResult(samples.sequences(), prompt_values, prompt_top)
    logits = out.logits[:, -1].float().expand(n, -1)
    samples.step(list(range(n)), logits, _rows(params, n, device), uniforms[:, 0])
    return _Running(
        index, request, samples, uniforms, out.past_key_values, len(request.prompt), prompt_values, prompt_top
    )


def _joinable(cache: Any) -> bool:
    """Whether every layer of `cache` is a plain growing one (its keys can be padded and concatenated)."""
    from transformers.cache_utils import DynamicLayer

    layers: list[Any] = list(getattr(cache, "layers", None) or [])
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _join_caches(running: list[_Running], rows: list[tuple[_Running, int]], width: int) -> Any:
    """One cache of every row in `rows` (a request's cache repeated per row, left-padded to `width`); the
    first request's cache object holds it."""
    cache = running[0].cache
    for layer_index, layer in enumerate(cache.layers):
        for kind in ("keys", "values"):
            parts = []
            for state in running:
                count = sum(1 for owner, _ in rows if owner is state)
                if count == 0:
                    continue
                tensor = getattr(state.cache.layers[layer_index], kind)
                pad = width - tensor.shape[-2]
                padded = torch.nn.functional.pad(tensor, (0, 0, pad, 0))  # zeros on the left of the sequence
                parts.append(padded.expand(count, -1, -1, -1))
            setattr(layer, kind, torch.cat(parts, dim=0))
    return cache


def _decode_together(host: AdapterHost, running: list[_Running]) -> None:
    """Decode every live sample of every request in one forward per token (module doc)."""
    device = running[0].uniforms.device
    rows = [
        (state, i)
        for state in running
        for i in range(state.request.num_samples)
        if state.samples.reasons[i] is None
    ]
    if not rows:
        return
    width = max(state.prompt_len for state in running)
    cache = _join_caches(running, rows, width)
    lengths = torch.tensor([state.prompt_len for state, _ in rows], device=device)
    mask = (torch.arange(width, device=device)[None, :] >= (width - lengths)[:, None]).long()
    positions = lengths.clone()  # the position of each row's next input token
    chosen = torch.tensor([state.samples.tokens[i][-1] for state, i in rows], device=device)
    longest = max(state.request.params.max_tokens for state in running)
    with _decoder(host, {state.request.adapter for state, _ in rows}) as forward:
        _decode_loop(forward, rows, cache, mask, positions, chosen, longest)


def _decode_loop(
    forward: Callable[[list[str], dict[str, Any]], torch.Tensor],
    rows: list[tuple[_Running, int]],
    cache: Any,
    mask: torch.Tensor,
    positions: torch.Tensor,
    chosen: torch.Tensor,
    longest: int,
) -> None:
    """The decode steps after the first token: one `forward` per token over the live rows."""
    device = chosen.device
    for step in range(1, longest):
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        names = [BASE if state.request.adapter is None else state.request.adapter for state, _ in rows]
        inputs = {
            "input_ids": chosen[:, None],
            "attention_mask": mask,
            "position_ids": positions[:, None],
            "past_key_values": cache,
            "use_cache": True,
        }
        logits = forward(names, inputs)
        positions = positions + 1
        chosen = _choose(rows, logits, step, device)
        keep = [row for row, (state, i) in enumerate(rows) if state.samples.reasons[i] is None]
        if not keep:
            return
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask = mask[index]
            positions = positions[index]
            chosen = chosen[index]
            rows = [rows[row] for row in keep]


@contextlib.contextmanager
def _decoder(
    host: AdapterHost, adapters: set[str | None]
) -> Iterator[Callable[[list[str], dict[str, Any]], torch.Tensor]]:
    """(row adapter names, forward inputs) -> last-position logits [B, V] float32, for the whole decode:
    one adapter is made active once (or the base); several go through peft's mixed batch."""
    mixed = host.mixed()
    if len(adapters) == 1 or mixed is None:  # one adapter (or no peft model yet): simply active
        with host.active(next(iter(adapters))) as module, _inference(module):
            yield lambda names, inputs: module(**inputs).logits[:, -1].float()
        return
    with _inference(mixed):
        yield lambda names, inputs: mixed(**inputs, adapter_names=names).logits[:, -1].float()


def _choose(
    rows: list[tuple[_Running, int]], logits: torch.Tensor, step: int, device: torch.device
) -> torch.Tensor:
    """Each request's tokens from its rows of `logits` (its rows are consecutive), as `sample` chooses
    them; returns the tokens [B] in row order."""
    chosen = torch.empty(len(rows), dtype=torch.int64, device=device)
    start = 0
    while start < len(rows):
        state = rows[start][0]
        end = start
        while end < len(rows) and rows[end][0] is state:
            end += 1
        active = [i for _, i in rows[start:end]]
        params = state.request.params
        chosen[start:end] = state.samples.step(
            active, logits[start:end], _rows(params, len(active), device), state.uniforms[active, step]
        )
        start = end
    return chosen
