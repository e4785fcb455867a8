"""What goes into and comes out of a rollout engine: token ids in, token ids and log-probs out.

Choices that every engine behind `RolloutEngine` follows (they match vLLM's defaults where vLLM has one):

- **Log-probs** are those of the sampled token under `log_softmax(logits / T)`: temperature applied, top-k and
  top-p *not* applied. That is the value the trainer recomputes (`log_softmax(logits / T)` over the full
  vocabulary), so `rollout_logprobs` and the trainer's old log-probs differ only by numerics and weight
  staleness; the truncated distribution that top-k/top-p actually sample from would differ by the log of the
  kept mass. Greedy decoding (T = 0) reports `log_softmax(logits)`, i.e. T = 1.
  With penalties or `min_tokens` (off by default), `logits` means the processed logits the token was sampled
  from (penalties applied, stop ids masked), so the log-prob stays that of the distribution actually
  sampled; the trainer's recomputation knows no penalties, so such rollouts are off-policy by design.
  `top_logprobs` are taken from the same distribution. The same holds for a `grammar` (constrained
  decoding): the forbidden tokens are masked, and log-probs are those of the masked distribution.
- **Stop tokens** (the model's end-of-sequence ids unless `ignore_eos`, plus `stop_token_ids`) are generated
  tokens: they are kept at the end of `token_ids` (the policy must learn to emit them), as vLLM keeps them in
  its output ids. `stop_reason` names the id.
- **Stop strings** end generation at the token whose text completes the string. That token and all before it
  are kept in `token_ids`: a token cannot be cut in half, and token-in/token-out callers must train on the
  exact ids the model wrote. (vLLM cuts the *text* before the stop string; it has no text here.)
  `stop_reason` names the string.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from quartet.config.rollout import SamplingConfig
from quartet.rollout.invalid_request import InvalidRequestError, is_int, require_finite, require_integer

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAX_TOP_LOGPROBS",
    "FinishReason",
    "GenerationOutput",
    "GenerationRequest",
    "InvalidRequestError",
    "PromptLogprob",
    "SamplingParams",
    "TopLogprobs",
    "check_sampling",
    "new_request_id",
]

TopLogprobs = tuple[tuple[int, float], ...]
"""The most likely tokens at one position as (token id, log-prob) pairs, most likely first."""

_request_ids = itertools.count()

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token in `top_logprobs` (OpenAI's limit, vLLM's default `max_logprobs`)."""

_INT64_MAX = (1 << 63) - 1
_SEED_MIN = -(1 << 63)  # any signed or unsigned 64-bit seed
_SEED_MAX = (1 << 64) - 1


def _token_ids(field_name: str, values: Iterable[Any], request_id: str | None = None) -> tuple[int, ...]:
    """`values` as a tuple of ints (numpy and torch integers, and floats holding whole numbers, accepted)."""
    ids: list[int] = []
    for t in values:
        try:
            ids.append(operator.index(t))
        except TypeError:
            if not (isinstance(t, float) and t.is_integer()):  # not inf, nan, 1.5, "3"
                raise InvalidRequestError(
                    field_name, f"token ids must be integers, got {t!r}", request_id
                ) from None
            ids.append(int(t))
    return tuple(ids)


def new_request_id() -> str:
    """A process-unique request id (`req-<number>`)."""
    return f"req-{next(_request_ids)}"


class FinishReason(StrEnum):
    """Why a sequence stopped."""

    STOP = "stop"  # a stop token id or stop string was generated
    LENGTH = "length"  # max_new_tokens reached, or the model's context length
    ABORT = "abort"  # aborted by the caller or by engine shutdown


@dataclass(frozen=True)
class SamplingParams:
    """How to sample the responses of one request."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""

    top_p: float = 1.0
    """Nucleus sampling: keep the most likely tokens whose mass before each reaches `top_p`; 1 disables."""

    top_k: int = 0
    """Keep the k most likely tokens; 0 disables (as does any k >= the vocabulary). At most 2**63 - 1."""

    max_new_tokens: int = 256
    """Most tokens generated per response (the stop token counts)."""

    n: int = 1
    """Responses sampled from the same prompt (the prompt is prefilled once and its KV cache shared)."""

    seed: int | None = None
    """Seed of this request's sampling; the same seed gives the same responses. None: the engine picks."""

    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a response (in addition to the model's end-of-sequence ids); kept in the output."""

    stop: tuple[str, ...] = ()
    """Strings that end a response when its decoded text contains one (needs the engine's tokenizer)."""

    ignore_eos: bool = False
    """Do not stop at the model's end-of-sequence ids (benchmarks, fixed-length rollouts)."""

    return_logprobs: bool = True
    """Return the log-prob of each generated token under `log_softmax(logits / T)`."""

    presence_penalty: float = 0.0
    """OpenAI's presence penalty in [-2, 2]: subtracted from the logit of every token generated so far in
    this response (the prompt does not count). 0 disables."""

    frequency_penalty: float = 0.0
    """OpenAI's frequency penalty in [-2, 2]: `frequency_penalty * count` is subtracted from each token's
    logit, count = times the token was generated so far in this response. 0 disables."""

    repetition_penalty: float = 1.0
    """vLLM's / transformers' repetition penalty (> 0): over the tokens of the prompt AND the response so
    far, positive logits are divided by it and negative ones multiplied by it. 1 disables."""

    min_tokens: int = 0
    """End-of-sequence and stop token ids are masked (and stop strings not checked) until this many tokens
    are generated; at most `max_new_tokens`. 0 disables."""

    top_logprobs: int = 0
    """Return, per generated token, the `top_logprobs` most likely tokens and their log-probs (at most 20)
    under the distribution the token was sampled from (`GenerationOutput.top_logprobs`). 0 disables."""

    grammar: str | None = None
    """Constrained decoding: an llguidance grammar (what `llguidance.LLMatcher.grammar_from_json_schema`
    / `grammar_from_lark` return, or Lark text) that every response must follow. Tokens the grammar
    forbids are masked before sampling, and a response ends (finish reason "stop") as soon as the grammar
    is complete. Built-in engine only; None (the default) samples freely at no cost."""

    def __post_init__(self) -> None:
        # Accept lists from callers (YAML, JSON) but store tuples, so params stay hashable and immutable.
        object.__setattr__(self, "stop_token_ids", _token_ids("stop_token_ids", self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))
        check_sampling(self)  # InvalidRequestError (a ValueError) naming the field

    @classmethod
    def from_config(
        cls,
        cfg: SamplingConfig,
        *,
        max_new_tokens: int,
        seed: int | None = None,
        stop_token_ids: tuple[int, ...] = (),
        stop: tuple[str, ...] = (),
    ) -> SamplingParams:
        """The parameters of a `SamplingConfig` (temperature, top-p, top-k, n) with a response limit."""
        return cls(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            n=cfg.n,
            max_new_tokens=max_new_tokens,
            seed=seed,
            stop_token_ids=stop_token_ids,
            stop=stop,
        )

    @property
    def greedy(self) -> bool:
        """True when the responses are argmax decoded."""
        return self.temperature == 0.0

    @property
    def uses_penalties(self) -> bool:
        """True when a penalty or `min_tokens` changes the logits before sampling."""
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
            or self.min_tokens > 0
        )

    @property
    def uses_filter(self) -> bool:
        """True when top-k or top-p truncates the distribution."""
        return self.top_k > 0 or self.top_p < 1.0


def check_sampling(params: SamplingParams) -> None:
    """Raise `InvalidRequestError` when a sampling value is out of range (independent of the engine)."""
    temperature = require_finite("temperature", params.temperature)
    if temperature < 0:
        raise InvalidRequestError("temperature", f"must be >= 0 (0 = greedy), got {temperature}")
    top_p = require_finite("top_p", params.top_p)
    if not 0.0 < top_p <= 1.0:
        raise InvalidRequestError("top_p", f"must lie in (0, 1], got {top_p}")
    if not is_int(params.top_k) or params.top_k < 0:
        raise InvalidRequestError("top_k", f"must be >= 0 (0 disables), got {params.top_k!r}")
    require_integer("top_k", params.top_k, 0, _INT64_MAX)
    if not is_int(params.max_new_tokens) or params.max_new_tokens < 1:
        raise InvalidRequestError("max_new_tokens", f"must be >= 1, got {params.max_new_tokens!r}")
    require_integer("max_new_tokens", params.max_new_tokens, 1, _INT64_MAX)
    if not is_int(params.n) or params.n < 1:
        raise InvalidRequestError("n", f"n must be >= 1, got {params.n!r}")
    if params.seed is not None:
        require_integer("seed", params.seed, _SEED_MIN, _SEED_MAX)
    for token in params.stop_token_ids:
        require_integer("stop_token_ids", token, 0, _INT64_MAX)
    if any(not isinstance(s, str) or not s for s in params.stop):
        raise InvalidRequestError("stop", "stop strings must not be empty")
    for name in ("presence_penalty", "frequency_penalty"):
        value = require_finite(name, getattr(params, name))
        if not -2.0 <= value <= 2.0:
            raise InvalidRequestError(name, f"must lie in [-2, 2], got {value}")
    repetition = require_finite("repetition_penalty", params.repetition_penalty)
    if repetition <= 0:
        raise InvalidRequestError("repetition_penalty", f"must be > 0 (1 disables), got {repetition}")
    require_integer("min_tokens", params.min_tokens, 0, params.max_new_tokens)
    require_integer("top_logprobs", params.top_logprobs, 0, MAX_TOP_LOGPROBS)
    if params.grammar is not None and (not isinstance(params.grammar, str) or not params.grammar.strip()):
        raise InvalidRequestError("grammar", "must be a non-empty llguidance grammar string, or None")


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt, as token ids, and how to sample `sampling.n` responses to it."""

    prompt_token_ids: tuple[int, ...]
    """The prompt, without padding."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Sampling parameters."""

    request_id: str = field(default_factory=new_request_id)
    """Caller-chosen id (unique among requests in flight); used by `abort`."""

    multi_modal: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """The prompt's processed images for a vision-language model: `pixel_values` and `image_grid_thw`
    (one row of the batch's `multi_modal_inputs`), and the encoded `images` (for engines that process
    images themselves, vLLM); None for a text prompt."""
    prompt_logprobs: int | None = None
    """vLLM's `prompt_logprobs`: score the prompt itself, per token (but the first) its log-prob, its rank
    and the `prompt_logprobs` most likely tokens there (0..20), under the raw model (log_softmax(logits),
    T = 1 whatever `sampling.temperature`, as vLLM does) (`GenerationOutput.prompt_logprobs`). None: not
    computed. Built-in engine only."""

    def __post_init__(self) -> None:
        ids = _token_ids("prompt_token_ids", self.prompt_token_ids, self.request_id)
        if not ids:
            raise InvalidRequestError("prompt_token_ids", "the prompt is empty", self.request_id)
        object.__setattr__(self, "prompt_token_ids", ids)
        if self.prompt_logprobs is not None:
            try:
                require_integer("prompt_logprobs", self.prompt_logprobs, 0, MAX_TOP_LOGPROBS)
            except InvalidRequestError as exc:
                raise InvalidRequestError(exc.field, exc.reason, self.request_id) from None


@dataclass(frozen=True)
class PromptLogprob:
    """One prompt token scored by the model that reads the tokens before it (vLLM's prompt logprobs)."""

    token_id: int
    """The prompt's token at this position."""
    logprob: float
    """Its log-prob under log_softmax(logits) of the position before (T = 1)."""
    rank: int
    """1 + the number of tokens strictly likelier there (1: the model's argmax)."""
    top: TopLogprobs
    """The `prompt_logprobs` most likely tokens there, most likely first (empty for 0)."""


@dataclass(frozen=True)
class GenerationOutput:
    """One sampled response."""

    request_id: str
    """Id of the request it answers."""

    sample_index: int
    """Which of the request's `n` samples (0..n-1)."""

    token_ids: tuple[int, ...]
    """Generated token ids [R], the stop token included when one ended the response."""

    logprobs: tuple[float, ...] | None
    """Log-prob of each generated token under log_softmax(logits / T) [R]; None unless requested."""

    finish_reason: FinishReason
    """Why it stopped."""

    stop_reason: int | str | None = None
    """The stop token id or stop string that ended it (finish_reason STOP), else None."""

    first_step: int = 0
    """Engine step at which the sequence was admitted (prefilled)."""

    finish_step: int = 0
    """Engine step at which it finished; lets callers see continuous batching at work."""

    finish_time: float = 0.0
    """`time.perf_counter()` when it finished."""

    top_logprobs: tuple[TopLogprobs, ...] | None = None
    """Per generated token [R], its `sampling.top_logprobs` most likely alternatives under the distribution
    it was sampled from (the same one as `logprobs`); None unless `sampling.top_logprobs > 0`."""

    versions: tuple[int, ...] | None = None
    """Per generated token [R], the weight version of the engine that computed it (weights synced while the
    sequence was in flight change it mid-response); None where the engine does not track versions."""

    routed_experts: torch.Tensor | None = field(default=None, compare=False, repr=False)
    """MoE models with routing recorded (`rollout.record_routing`, built-in engine): the top-k expert indices
    [prompt + R - 1, L, k] (uint8 for <= 256 experts, else int16) of every token the engine fed through the
    model: the prompt, then every generated token but the last (never fed back). None otherwise."""
    prompt_logprobs: tuple[PromptLogprob | None, ...] | None = field(default=None, compare=False, repr=False)
    """With `GenerationRequest.prompt_logprobs` set: per prompt token [P], its score (None for the first
    token, which nothing precedes), shared by the request's samples; None otherwise."""
