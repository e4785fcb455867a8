"""`sampling_batch.sample_many` on a real `AdapterHost` (the tiny model, two LoRA adapters and the base):
every request answers what `sampling.sample` answers for it alone, whatever shares its batch; a request
that fails on its own fails only its slot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from quartet.serving.tinker.adapters import AdapterHost, AdapterSpec
from quartet.serving.tinker.sampling import SampleParams, SampleResult, sample
from quartet.serving.tinker.sampling_batch import SampleRequest, sample_many


@pytest.fixture(scope="module")
def host(tiny_model_dir: Path) -> Iterator[AdapterHost]:
    """Adapters "alpha" and "beta" with random LoRA weights (B != 0), so each really changes the model."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    host = AdapterHost(tiny_model_dir)
    generator = torch.Generator().manual_seed(0)
    for name, seed in (("alpha", 1), ("beta", 2)):
        host.add(name, AdapterSpec(4, seed), trainable=False)
        state = host.adapter_state(name)
        host.load_adapter_state(
            name, {k: torch.randn(v.shape, generator=generator) * 0.3 for k, v in state.items()}
        )
    yield host
    torch.set_num_threads(threads)


def _alone(host: AdapterHost, request: SampleRequest) -> SampleResult:
    with host.active(request.adapter) as module:
        return sample(
            module,
            request.prompt,
            request.params,
            request.num_samples,
            decode=host.decode,
            prompt_logprobs=request.prompt_logprobs,
            topk_sample_logprobs=request.topk_sample_logprobs,
        )


def _assert_same(got: SampleResult, expected: SampleResult) -> None:
    assert len(got.sequences) == len(expected.sequences)
    for seq, ref in zip(got.sequences, expected.sequences, strict=True):
        assert (seq.tokens, seq.stop_reason) == (ref.tokens, ref.stop_reason)
        torch.testing.assert_close(torch.tensor(seq.logprobs), torch.tensor(ref.logprobs), atol=1e-4, rtol=0)
        if ref.topk is not None:
            assert seq.topk is not None
            assert torch.equal(seq.topk.ids, ref.topk.ids)
    if expected.prompt_logprobs is not None:
        assert got.prompt_logprobs is not None
        torch.testing.assert_close(got.prompt_logprobs, expected.prompt_logprobs, equal_nan=True)


STOPS = frozenset(range(0, 512, 7))  # about one token in seven ends a sample: rows leave at different steps


def test_each_request_equals_sample_alone_and_bad_requests_fail_their_slot_only(host: AdapterHost) -> None:
    requests = [
        SampleRequest("alpha", (5, 17, 33), SampleParams(12, 1.0, seed=3), 3, prompt_logprobs=True),
        SampleRequest(
            None, (5, 17, 33, 2, 9, 41, 8), SampleParams(8, 0.7, top_k=20, seed=4, stop_token_ids=STOPS), 4
        ),
        SampleRequest("gone", (1, 2), SampleParams(4, seed=1), 1),  # an adapter unloaded since queued
        SampleRequest("beta", (9,), SampleParams(16, 1.0, top_p=0.9, seed=5), 2, topk_sample_logprobs=3),
        SampleRequest("alpha", (), SampleParams(4, seed=1), 1),  # an empty prompt
        SampleRequest("alpha", (1, 2, 3, 4, 5), SampleParams(10, 0.0, stop_token_ids=STOPS), 2),
        SampleRequest("beta", (40, 41), SampleParams(6, 1.0, seed=6), 3),
        SampleRequest(None, (3, 4, 5), SampleParams(12, 1.0, stop_strings=("e",), seed=7), 3),  # text stops
        SampleRequest("alpha", (8, 9), SampleParams(1, 1.0, seed=8), 2),  # done at its first token
    ]
    answers = sample_many(host, requests)
    assert isinstance(answers[2], KeyError) and "gone" in str(answers[2])
    assert isinstance(answers[4], ValueError) and "non-empty prompt" in str(answers[4])
    reasons = set()
    for request, answer in zip(requests, answers, strict=True):
        if request.adapter == "gone" or not request.prompt:
            continue
        assert isinstance(answer, SampleResult)
        _assert_same(answer, _alone(host, request))
        reasons |= {seq.stop_reason for seq in answer.sequences}
    assert reasons == {"stop", "length"}  # the stop tokens did end some rows early
    texts = [host.decode(seq.tokens) for seq in answers[7].sequences]  # type: ignore[union-attr]
    assert any("e" in text for text in texts), texts


def test_the_adapters_differ_so_a_mixed_up_row_would_show(host: AdapterHost) -> None:
    """The same prompt and seed through alpha, beta and the base: three different samples (what makes the test
    above able to see a row decoded through another row's adapter)."""
    requests = [
        SampleRequest(name, (5, 17, 33), SampleParams(12, 1.0, seed=3), 2) for name in ("alpha", "beta", None)
    ]
    a, b, base = (answer.sequences[0].tokens for answer in sample_many(host, requests))  # type: ignore[union-attr]
    assert a != b and a != base and b != base
