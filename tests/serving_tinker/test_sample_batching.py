"""Sample requests of several clients and adapters, queued together, run as one batch through the real SDK
(issue 51 item 3): each request's samples equal the same request sent alone, and the batch took fewer
forwards than the requests alone.

The service runs in this process (so the test can hold its base's thread while the requests queue, and
count the host's forwards); the SDK is the real `tinker` client over HTTP.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
from tinker import types  # noqa: E402

KEY = "tml-quartet-batch-key"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[Any]:
    """A `TinkerServer` in this process (torch on one thread while it runs)."""
    from quartet.serving.tinker.server import TinkerServer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    server = TinkerServer({"tiny": tiny_model_dir}, api_key=KEY)
    server.url = server.start_in_thread()
    yield server
    server.stop_thread()
    torch.set_num_threads(threads)


def _client(server: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return tinker.ServiceClient(base_url=server.url, api_key=KEY)


def _trained_sampler(client: Any, seed: int, target: int) -> Any:
    """A sampling client on a LoRA trained one step (lr 0.05) towards `target`: adapters that differ."""
    trainer = client.create_lora_training_client(base_model="tiny", rank=4, seed=seed).result()
    tokens = [5, 17, 33, 2, 9]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": [target] * len(tokens), "weights": [1.0] * len(tokens)},
    )
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=0.05)).result()
    return trainer.save_weights_and_get_sampling_client().result()


def _requests(samplers: dict[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
    """(sampling client, sample kwargs): prompts of different lengths, every adapter and the base."""

    def params(seed: int, **extra: Any) -> types.SamplingParams:
        return types.SamplingParams(**{"max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": seed, **extra})

    def ask(prompt: list[int], n: int, sampling: types.SamplingParams, **extra: Any) -> dict[str, Any]:
        return {"prompt": types.ModelInput.from_ints(prompt), "num_samples": n, "sampling_params": sampling,
                **extra}  # fmt: skip

    return [
        (samplers["a"], ask([5, 17, 33], 3, params(1), include_prompt_logprobs=True)),
        (samplers["b"], ask([9, 4, 12, 40, 7, 3, 21, 8], 2, params(2))),
        (samplers["base"], ask([11], 4, params(3, top_k=20))),
        (samplers["a"], ask([2, 3, 4, 5, 6], 2, params(4, top_p=0.9))),
        (samplers["b"], ask([30, 31], 1, params(5), topk_sample_logprobs=3)),
        (samplers["base"], ask([7, 7, 7, 7], 2, params(6, max_tokens=4))),
    ]


def _forward_counter(host: Any) -> list[int]:
    """Counts the forwards of the host's peft model (every prefill and decode step goes through it)."""
    count = [0]
    module = host.mixed()
    assert module is not None
    module.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def test_concurrent_requests_of_two_clients_and_the_base_run_as_one_batch_and_equal_alone(
    server: Any,
) -> None:
    first, second = _client(server), _client(server)
    try:
        samplers = {
            "a": _trained_sampler(first, seed=1, target=3),
            "b": _trained_sampler(second, seed=2, target=40),
            "base": first.create_sampling_client(base_model="tiny").result(),
        }
        entry = server.state.hosts["tiny"]
        forwards = _forward_counter(entry.host.host)
        requests = _requests(samplers)

        gate = threading.Event()
        entry.queues.submit("test-hold", gate.wait)  # the base's thread waits until every request is queued
        futures = [sampler.sample(**kwargs) for sampler, kwargs in requests]
        deadline = time.monotonic() + 10
        while entry.queues.waiting() < len(requests) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert entry.queues.waiting() == len(requests)
        runs_before = len(entry.queues.batch_sizes())
        forwards[0] = 0
        gate.set()
        together = [future.result() for future in futures]
        batched_forwards = forwards[0]
        assert entry.queues.batch_sizes()[runs_before:] == [len(requests)]  # one run held every request

        forwards[0] = 0
        alone = [sampler.sample(**kwargs).result() for sampler, kwargs in requests]
        alone_forwards = forwards[0]
        # alone: one prefill and up to MAX_TOKENS - 1 decode forwards per request; together: the same prefills
        # and up to MAX_TOKENS - 1 decode forwards for all of them
        assert batched_forwards <= len(requests) + MAX_TOKENS - 1
        assert batched_forwards < alone_forwards

        for (_, kwargs), got, expected in zip(requests, together, alone, strict=True):
            assert len(got.sequences) == kwargs["num_samples"]
            for seq, ref in zip(got.sequences, expected.sequences, strict=True):
                assert seq.tokens == ref.tokens
                assert seq.stop_reason == ref.stop_reason
                torch.testing.assert_close(
                    torch.tensor(seq.logprobs), torch.tensor(ref.logprobs), atol=1e-4, rtol=0
                )
            if kwargs.get("include_prompt_logprobs"):
                assert got.prompt_logprobs[0] is None
                torch.testing.assert_close(
                    torch.tensor(got.prompt_logprobs[1:]),
                    torch.tensor(expected.prompt_logprobs[1:]),
                    atol=1e-4,
                    rtol=0,
                )
        # the adapters really differ: the same prompt and seed sample differently through a, b and the base
        sampling = types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=9)
        same = {
            "prompt": types.ModelInput.from_ints([5, 17, 33]),
            "num_samples": 4,
            "sampling_params": sampling,
        }
        outs = {
            name: [s.tokens for s in samplers[name].sample(**same).result().sequences] for name in samplers
        }
        assert outs["a"] != outs["b"] and outs["a"] != outs["base"] and outs["b"] != outs["base"]
    finally:  # their sessions and heartbeat threads end with the test
        for client in (first, second):
            client.close("success").result(timeout=30)
