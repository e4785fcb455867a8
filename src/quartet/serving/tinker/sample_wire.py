"""The SDK's sampling bodies: `create_sampling_session`, `asample` (JSON) in, `SampleResponse` (protobuf) out.

Every malformed field raises `WireError` naming it (the server answers 400, the SDK's `BadRequestError`):
`decode_sample` checks what the body alone can tell, `check_against_model` what needs the model (token ids
within its vocabulary, prompt + max_tokens within its context). Limits are the service's (`SampleLimits`).
The request's shape, as the SDK 0.38 sends it: docs/notes/tinker_protocol.md, "Sampling".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from quartet.serving.tinker.sampling import SampleParams, SampleResult, TopK
from quartet.serving.tinker.wire import WireError, _pb

__all__ = [
    "SampleCall",
    "SampleLimits",
    "SessionTarget",
    "check_against_model",
    "decode_sample",
    "decode_sampling_session",
    "encode_sample_response",
]

_MASK_LOGPROB = -99999.0  # the schema's filler of an empty top-k cell (with token id 0)
_NOT_SERVED = ("target_prompt_logprobs", "prompt_alt_tokens_k", "record_stability_info")


@dataclasses.dataclass(frozen=True)
class SampleLimits:
    """The service's bounds on one sample request (constructor arguments of `TinkerServer`)."""

    max_num_samples: int = 64
    """Most samples per request; more is a 400 naming `num_samples`."""
    max_tokens: int = 2048
    """Most tokens per sample; also what an absent `max_tokens` means (within the model's context)."""
    max_topk: int = 20
    """Most top-k logprobs per position (prompt or sampled)."""


@dataclasses.dataclass(frozen=True)
class SessionTarget:
    """What a sampling session samples from: a configured base model, or (not served yet) a saved path."""

    base_model: str | None
    model_path: str | None


@dataclasses.dataclass(frozen=True)
class SampleCall:
    """A decoded `asample` body. `stop` is None (keep EOS), token ids, or strings; see `SampleParams`."""

    sampling_session_id: str | None
    target: SessionTarget
    seq_id: int | None
    prompt: list[int]
    num_samples: int
    max_tokens: int | None
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    stop: tuple[int, ...] | tuple[str, ...] | None
    prompt_logprobs: bool
    topk_prompt_logprobs: int
    topk_sample_logprobs: int
    prompt_logprobs_last_n: int | None

    def params(self, max_tokens: int, eos_ids: frozenset[int]) -> SampleParams:
        """The sampler's parameters: `stop` None keeps the model's EOS ids; `[]` stops on nothing; a list of
        ids stops on those and EOS (the SDK: "[] disables all stop tokens, including EOS"); strings stop on
        those texts and EOS."""
        ids = frozenset() if self.stop == () else eos_ids
        strings: tuple[str, ...] = ()
        if self.stop:
            if isinstance(self.stop[0], str):
                strings = tuple(str(s) for s in self.stop)
            else:
                ids = ids | frozenset(int(t) for t in self.stop)
        return SampleParams(max_tokens, self.temperature, self.top_k, self.top_p, ids, strings, self.seed)


def _int(body: Mapping[str, Any], key: str, field: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(field, f"must be an integer, not {value!r}")
    if not lo <= value <= hi:
        raise WireError(field, f"{value} is outside [{lo}, {hi}]")
    return value


def _float(body: Mapping[str, Any], key: str, field: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise WireError(field, f"must be a finite number, not {value!r}")
    return float(value)


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise WireError(key, "must be a string")
    return value


def decode_sampling_session(body: Mapping[str, Any]) -> SessionTarget:
    """`create_sampling_session` {session_id, sampling_session_seq_id, base_model?, model_path?}."""
    target = SessionTarget(_optional_str(body, "base_model"), _optional_str(body, "model_path"))
    if target.base_model is None and target.model_path is None:
        raise WireError("base_model", "give base_model or model_path")
    return target


def _prompt(body: Mapping[str, Any]) -> list[int]:
    prompt = body.get("prompt")
    chunks = prompt.get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list):
        raise WireError("prompt", "must be a ModelInput {chunks: [...]}")
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise WireError(f"prompt.chunks[{i}]", f"{kind} chunks are not served yet (text tokens only)")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
            raise WireError(f"prompt.chunks[{i}].tokens", "must be a list of integer token ids")
        tokens.extend(ids)
    if not tokens:
        raise WireError("prompt", "no tokens (an empty prompt has nothing to condition on)")
    return tokens


def _stop(params: Mapping[str, Any]) -> tuple[int, ...] | tuple[str, ...] | None:
    stop = params.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list):
        raise WireError("sampling_params.stop", "must be a string, a list of strings or a list of token ids")
    if all(isinstance(s, str) for s in stop):
        if any(not s for s in stop):
            raise WireError("sampling_params.stop", "an empty stop string would stop at once")
        return tuple(stop)
    if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        return tuple(stop)
    raise WireError("sampling_params.stop", "must be all strings or all token ids")


def decode_sample(body: Mapping[str, Any], limits: SampleLimits) -> SampleCall:
    """The `asample` body, checked field by field (the model-dependent checks: `check_against_model`)."""
    for key in _NOT_SERVED:
        if body.get(key):
            raise WireError(key, "is not served yet by quartet's Tinker service")
    params = body.get("sampling_params")
    if not isinstance(params, dict):
        raise WireError("sampling_params", "missing (a SamplingParams object)")
    temperature = _float(params, "temperature", "sampling_params.temperature", 1.0)
    if temperature < 0:
        raise WireError("sampling_params.temperature", f"{temperature} is negative (0 is greedy)")
    top_p = _float(params, "top_p", "sampling_params.top_p", 1.0)
    if not 0 < top_p <= 1:
        raise WireError("sampling_params.top_p", f"{top_p} is outside (0, 1]")
    seq_id = body.get("seq_id")
    prompt_logprobs = bool(body.get("prompt_logprobs") or False)
    last_n = _int(body, "prompt_logprobs_last_n", "prompt_logprobs_last_n", None, 1, 2**31)
    if last_n is not None and not prompt_logprobs:
        raise WireError("prompt_logprobs_last_n", "needs prompt_logprobs")
    return SampleCall(
        sampling_session_id=_optional_str(body, "sampling_session_id"),
        target=SessionTarget(_optional_str(body, "base_model"), _optional_str(body, "model_path")),
        seq_id=seq_id if isinstance(seq_id, int) else None,
        prompt=_prompt(body),
        num_samples=_int(body, "num_samples", "num_samples", 1, 1, limits.max_num_samples) or 1,
        max_tokens=_int(params, "max_tokens", "sampling_params.max_tokens", None, 1, limits.max_tokens),
        temperature=temperature,
        top_k=_int(params, "top_k", "sampling_params.top_k", -1, -1, 2**31) or -1,
        top_p=top_p,
        seed=_int(params, "seed", "sampling_params.seed", None, 0, 2**64 - 1),
        stop=_stop(params),
        prompt_logprobs=prompt_logprobs,
        topk_prompt_logprobs=_int(body, "topk_prompt_logprobs", "topk_prompt_logprobs", 0, 0, limits.max_topk)
        or 0,
        topk_sample_logprobs=_int(body, "topk_sample_logprobs", "topk_sample_logprobs", 0, 0, limits.max_topk)
        or 0,
        prompt_logprobs_last_n=last_n,
    )


def check_against_model(call: SampleCall, vocab: int, context: int | None, limits: SampleLimits) -> int:
    """The checks that need the model: ids in [0, vocab), prompt + max_tokens <= context. Returns the
    max_tokens to sample (an absent one: the service's cap, or what the context leaves if less)."""
    ids = np.asarray(call.prompt, dtype=np.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise WireError("prompt", f"token ids must lie in [0, {vocab})")
    if call.stop and not isinstance(call.stop[0], str) and not all(0 <= int(t) < vocab for t in call.stop):
        raise WireError("sampling_params.stop", f"stop token ids must lie in [0, {vocab})")
    n = len(call.prompt)
    if call.prompt_logprobs_last_n is not None and call.prompt_logprobs_last_n > n - 1:
        raise WireError("prompt_logprobs_last_n", f"must be at most len(prompt) - 1 = {n - 1}")
    room = limits.max_tokens if context is None else min(limits.max_tokens, context - n)
    if call.max_tokens is None:
        if room < 1:
            raise WireError("prompt", f"{n} tokens leave no room in the model's context of {context}")
        return room
    if context is not None and n + call.max_tokens > context:
        raise WireError(
            "sampling_params.max_tokens",
            f"prompt ({n}) + max_tokens ({call.max_tokens}) exceeds the model's context of {context} tokens",
        )
    return call.max_tokens


def _topk(msg: Any, topk: TopK) -> None:
    ids = topk.ids.numpy().astype("<i4")
    logprobs = topk.logprobs.numpy().astype("<f4")
    logprobs = np.where(np.isfinite(logprobs), logprobs, np.float32(_MASK_LOGPROB))
    msg.token_ids = np.ascontiguousarray(ids).tobytes()
    msg.logprobs = np.ascontiguousarray(logprobs).tobytes()
    msg.length, msg.k = ids.shape


def encode_sample_response(result: SampleResult) -> bytes:
    """The protobuf `SampleResponse` the SDK's future expects (tokens int32, logprobs float32, NaN for the
    prompt positions not scored, top-k rows with the schema's empty-cell filler)."""
    pb = _pb()
    msg = pb.SampleResponse()
    for seq in result.sequences:
        out = msg.sequences.add()
        out.stop_reason = pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH
        out.tokens = np.asarray(seq.tokens, dtype="<i4").tobytes()
        out.logprobs = np.asarray(seq.logprobs, dtype="<f4").tobytes()
        if seq.topk is not None:
            _topk(out.topk_sampled_logprobs, seq.topk)
    if result.prompt_logprobs is not None:
        msg.prompt_logprobs = result.prompt_logprobs.numpy().astype("<f4").tobytes()
    if result.prompt_topk is not None:
        _topk(msg.topk_prompt_logprobs, result.prompt_topk)
    return bytes(msg.SerializeToString())
