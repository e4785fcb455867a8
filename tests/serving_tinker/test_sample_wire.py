"""`sample_wire` alone: what a request's `stop` means, and the SampleResponse as the SDK reads it back."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
from tinker.proto.response_conv import deserialize_sample_response  # noqa: E402

from quartet.serving.tinker.sample_wire import SampleLimits, decode_sample, encode_sample_response  # noqa: E402
from quartet.serving.tinker.sampling import SampledSequence, SampleResult, TopK  # noqa: E402

EOS = frozenset({3})


def _body(stop: Any) -> dict[str, Any]:
    params = {"max_tokens": 4} if stop == "absent" else {"max_tokens": 4, "stop": stop}
    return {"prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]}, "sampling_params": params}


@pytest.mark.parametrize(
    ("stop", "ids", "strings"),
    [
        ("absent", EOS, ()),  # None keeps EOS
        ([], frozenset(), ()),  # [] disables every stop, EOS included
        ([7, 9], EOS | {7, 9}, ()),
        ("\n\n", EOS, ("\n\n",)),
        (["a", "b"], EOS, ("a", "b")),
    ],
)
def test_stop_means_what_the_sdk_documents(stop: Any, ids: frozenset[int], strings: tuple[str, ...]) -> None:
    params = decode_sample(_body(stop), SampleLimits()).params(4, EOS)
    assert (params.stop_token_ids, params.stop_strings) == (ids, strings)


def test_the_sdk_reads_back_what_is_encoded() -> None:
    top = TopK(torch.tensor([[0, 0], [5, 6]]), torch.tensor([[-math.inf, -math.inf], [-0.5, -1.5]]))
    result = SampleResult(
        [SampledSequence([4, 2], [-0.25, -2.0], "stop", top), SampledSequence([1], [-1.0], "length")],
        torch.tensor([math.nan, -3.0]),
        top,
    )
    out = deserialize_sample_response(encode_sample_response(result))
    assert [(s.tokens, s.logprobs, s.stop_reason) for s in out.sequences] == [
        ([4, 2], [-0.25, -2.0], "stop"),
        ([1], [-1.0], "length"),
    ]
    assert out.prompt_logprobs == [None, -3.0]
    assert out.topk_prompt_logprobs == [None, [(5, -0.5), (6, -1.5)]]  # an empty row reads as None
    assert out.sequences[0].topk_logprobs == [None, [(5, -0.5), (6, -1.5)]]
    assert out.sequences[1].topk_logprobs is None
