"""Request checks: ranges independent of the engine (`check_sampling`) and the engine's limits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quartet.rollout import GenerationRequest, InvalidRequestError, SamplingParams
from quartet.rollout.validation import RequestLimits, check_request


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"top_k": 2**70}, "top_k"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": math.nan}, "top_p"),
        ({"seed": 2**70}, "seed"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"min_tokens": 30, "max_new_tokens": 20}, "min_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"stop_token_ids": (2**64,)}, "stop_token_ids"),
        ({"n": 0}, "n"),
    ],
)
def test_out_of_range_sampling_values_name_their_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field and isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad", [math.inf, math.nan, 1.5, "3", None])
def test_token_ids_must_be_integers(bad: object) -> None:
    with pytest.raises(InvalidRequestError) as info:
        GenerationRequest((1, bad))  # type: ignore[arg-type]
    assert info.value.field == "prompt_token_ids"
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(stop_token_ids=(bad,))  # type: ignore[arg-type]
    assert info.value.field == "stop_token_ids"


def test_integer_like_token_ids_are_accepted() -> None:
    request = GenerationRequest((np.int64(3), 4.0, np.int32(2)))  # type: ignore[arg-type]
    assert request.prompt_token_ids == (3, 4, 2) and all(type(t) is int for t in request.prompt_token_ids)


@pytest.mark.parametrize(
    ("prompt", "n", "field"),
    [
        ((0, 9, 10), 1, "prompt_token_ids"),
        ((-1,), 1, "prompt_token_ids"),
        ((1,) * 8, 1, "prompt_token_ids"),
        ((1,), 5, "n"),
    ],
)
def test_requests_must_fit_the_engine(prompt: tuple[int, ...], n: int, field: str) -> None:
    limits = RequestLimits(vocab_size=10, max_model_len=8, max_n=4)
    check_request(GenerationRequest((0, 9, 1), SamplingParams(n=4)), limits)  # at the limits: accepted
    with pytest.raises(InvalidRequestError) as info:
        check_request(GenerationRequest(prompt, SamplingParams(n=n), request_id="r"), limits)
    assert info.value.field == field and info.value.request_id == "r" and "request r" in str(info.value)


def test_engine_checks_rerun_the_sampling_ranges() -> None:
    params = SamplingParams()
    object.__setattr__(params, "temperature", -1.0)  # built around __post_init__
    with pytest.raises(InvalidRequestError, match="temperature"):
        check_request(GenerationRequest((1,), params), RequestLimits(vocab_size=10, max_model_len=8))
