"""The HTTP replica client against a real server; the scheduler over an in-process and a remote replica."""

from __future__ import annotations

import asyncio

import pytest
from serving_cases import API_KEY, MESSAGES, chat_prompt, direct
from transformers import PreTrainedTokenizerBase

from quartet.rollout import GenerationOutput, SamplingParams, TorchRolloutEngine
from quartet.serving import HttpReplicaClient, OpenAIServer, ReplicaError, RequestScheduler, ServerThread

Served = tuple[OpenAIServer, ServerThread, str]


def test_http_client_returns_the_engine_outputs(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = chat_prompt(serving_tokenizer, MESSAGES)
    sampling = SamplingParams(temperature=1.0, top_k=50, n=2, seed=3, max_new_tokens=10, stop=("zz",))
    refs = direct(
        serving_engine, prompt, temperature=1.0, top_k=50, n=2, seed=3, max_new_tokens=10, stop=("zz",)
    )

    async def run() -> list[GenerationOutput]:
        async with HttpReplicaClient(served[2], api_key=API_KEY) as replica:
            return await replica.generate_tokens(prompt, sampling)

    outs = asyncio.run(run())
    assert [o.sample_index for o in outs] == [0, 1]
    assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
    assert [o.finish_reason for o in outs] == [r.finish_reason for r in refs]
    for out, ref in zip(outs, refs, strict=True):
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
        assert out.request_id == outs[0].request_id


def test_http_client_raises_the_server_error(served: Served) -> None:
    async def run(api_key: str, prompt: list[int]) -> None:
        async with HttpReplicaClient(served[2], api_key=api_key) as replica:
            await replica.generate_tokens(prompt, SamplingParams(max_new_tokens=2))

    with pytest.raises(ReplicaError, match="401") as info:
        asyncio.run(run("wrong", [1, 2]))
    assert info.value.status == 401 and "API key" in info.value.message
    with pytest.raises(ReplicaError, match="does not fit") as too_long:  # the engine's ValueError, as a 400
        asyncio.run(run(API_KEY, [5] * 600))
    assert too_long.value.status == 400


def test_scheduler_over_a_local_and_a_remote_replica(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    server, _, url = served
    prompts = [
        chat_prompt(serving_tokenizer, [{"role": "user", "content": q}]) for q in ("hello", "12 + 7", "5 - 2")
    ]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    refs = [direct(serving_engine, p, temperature=0.0, max_new_tokens=8)[0].token_ids for p in prompts]

    async def run() -> list[list[GenerationOutput]]:
        async with HttpReplicaClient(url, api_key=API_KEY) as remote:
            scheduler = RequestScheduler(
                [server, remote], max_outstanding_per_replica=2, queue_timeout_s=30.0
            )
            outs = await asyncio.gather(
                *(
                    scheduler.generate_tokens(p, sampling, conversation_id=f"c{i}")
                    for i, p in enumerate(prompts)
                )
            )
            assert scheduler.stats().routed == (2, 1)
            assert [scheduler.replica_of(f"c{i}") for i in range(3)] == [0, 1, 0]
            return outs

    outs = asyncio.run(run())
    assert [o[0].token_ids for o in outs] == refs
