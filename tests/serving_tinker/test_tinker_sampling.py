"""Sampling through the official `tinker` SDK (issue 51, item 2): `sample`, `compute_logprobs`, sync, async.

A real `TinkerServer`, the real `tinker.ServiceClient` and `SamplingClient`, the tiny model. Every expected
number is computed here from the same model folder loaded independently (`_reference`): full forwards over
prompt + sampled tokens, with no KV cache, so the service's cached, batched decoding is checked against the
plain computation. No test depends on what the random tiny model happens to sample: stops are taken from
its own samples. Skipped where the `tinker` extra is not installed (`make install-tinker`).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
from tinker import types  # noqa: E402

from quartet.config.model import Dtype  # noqa: E402
from quartet.engines.model_init import build_model  # noqa: E402
from quartet.engines.spec import EngineSpec  # noqa: E402
from quartet.serving.tinker.adapters import AdapterSpec, reference_model  # noqa: E402
from quartet.serving.tinker.server import TinkerServer  # noqa: E402

KEY = "tml-quartet-sample-test"
PROMPT = [5, 17, 33, 2, 9, 41, 8]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[TinkerServer]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    server = TinkerServer({"tiny": tiny_model_dir}, api_key=KEY)
    server.start_in_thread()
    yield server
    server.stop_thread()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def service(server: TinkerServer, tiny_model_dir: Path) -> tuple[str, Path]:
    assert server.url is not None
    return server.url, tiny_model_dir


@pytest.fixture(scope="module")
def client(service: tuple[str, Path]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        client = tinker.ServiceClient(base_url=service[0], api_key=KEY)
    yield client
    client.close("success").result(timeout=30)  # ends its session and heartbeat thread


@pytest.fixture(scope="module")
def sampler(client: Any) -> Any:
    return client.create_sampling_client(base_model="tiny").result()


@pytest.fixture(scope="module")
def reference(service: tuple[str, Path]) -> torch.nn.Module:
    """The base model, loaded here independently of the service."""
    module = build_model(EngineSpec(str(service[1]), mixed_precision=Dtype.FLOAT32))
    return module.eval()


@pytest.fixture(scope="module")
def tokenizer(service: tuple[str, Path]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(service[1]), local_files_only=True)


def _sample(sampler: Any, n: int = 1, prompt: list[int] = PROMPT, **params: Any) -> Any:
    sampling = types.SamplingParams(**{"max_tokens": 6, "stop": [], **params})
    return sampler.sample(types.ModelInput.from_ints(prompt), n, sampling).result()


def _log_softmax(reference: torch.nn.Module, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) [len, V] of a full forward over `tokens` (row i predicts token i + 1)."""
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits / temperature, dim=-1)


def _scores(
    reference: torch.nn.Module, prompt: list[int], sampled: list[int], temperature: float
) -> torch.Tensor:
    """The logprob of each sampled token at `temperature`, recomputed from scratch."""
    rows = _log_softmax(reference, prompt + sampled, temperature)[len(prompt) - 1 : -1]
    return rows.gather(1, torch.tensor(sampled)[:, None])[:, 0]


def test_a_seed_repeats_its_samples_and_another_seed_changes_them(sampler: Any) -> None:
    first = _sample(sampler, 2, seed=11)
    torch.manual_seed(1234)  # whatever else runs: the global RNG moved, an unseeded request in between
    torch.rand(1000)
    unseeded = _sample(sampler, 2)
    again = _sample(sampler, 2, seed=11)
    other = _sample(sampler, 2, seed=12)
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]
    assert [s.tokens for s in first.sequences] != [s.tokens for s in other.sequences]
    assert [s.tokens for s in first.sequences] != [s.tokens for s in unseeded.sequences]
    assert first.sequences[0].tokens != first.sequences[1].tokens, "each sample has its own random stream"


def test_num_samples_sequences_whose_logprobs_and_top_k_are_log_softmax_at_the_temperature(
    sampler: Any, reference: torch.nn.Module
) -> None:
    """The logprobs of the distribution sampled from (as Tinker): log_softmax(logits / T), before top-k/p."""
    params = types.SamplingParams(max_tokens=5, seed=5, temperature=0.7, stop=[])
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 3, params, topk_sample_logprobs=2).result()
    assert len(out.sequences) == 3
    assert len({s.sequence_id for s in out.sequences}) == 3
    for seq in out.sequences:
        assert len(seq.tokens) == 5 and seq.stop_reason == "length"
        expected = _scores(reference, PROMPT, seq.tokens, 0.7)
        torch.testing.assert_close(torch.tensor(seq.logprobs), expected, rtol=1e-4, atol=1e-4)
        rows = _log_softmax(reference, PROMPT + seq.tokens, 0.7)[len(PROMPT) - 1 : -1]
        best, best_ids = rows.topk(2, dim=-1)
        assert [[t for t, _ in top] for top in seq.topk_logprobs] == best_ids.tolist()
        got = torch.tensor([[lp for _, lp in top] for top in seq.topk_logprobs])
        torch.testing.assert_close(got, best, rtol=1e-4, atol=1e-4)


def test_temperature_zero_and_top_k_one_are_argmax_decoding(sampler: Any, reference: torch.nn.Module) -> None:
    tokens: list[int] = []
    for _ in range(6):  # argmax decoding by hand: a full forward per token
        tokens.append(int(_log_softmax(reference, PROMPT + tokens)[-1].argmax()))
    greedy = _sample(sampler, 2, temperature=0.0).sequences
    assert [s.tokens for s in greedy] == [tokens, tokens]
    torch.testing.assert_close(torch.tensor(greedy[0].logprobs), _scores(reference, PROMPT, tokens, 1.0))
    assert _sample(sampler, 1, seed=3, top_k=1).sequences[0].tokens == tokens
    tiny = _sample(sampler, 1, seed=3, temperature=1e-300).sequences[0]  # 0 in float32: greedy, not T = 1
    assert tiny.tokens == tokens
    torch.testing.assert_close(torch.tensor(tiny.logprobs), torch.tensor(greedy[0].logprobs))  # at T = 1


def test_a_stop_token_or_stop_string_ends_the_sample_with_stop(sampler: Any, tokenizer: Any) -> None:
    free = _sample(sampler, 1, seed=21, max_tokens=8).sequences[0]
    assert free.stop_reason == "length" and len(free.tokens) == 8
    stop_token = free.tokens[4]
    cut = free.tokens.index(stop_token) + 1
    stopped = _sample(sampler, 1, seed=21, max_tokens=8, stop=[stop_token]).sequences[0]
    assert (stopped.tokens, stopped.stop_reason) == (free.tokens[:cut], "stop")

    text = next(t for t in (tokenizer.decode([tok]) for tok in free.tokens[2:]) if t.strip())
    end = next(j for j in range(1, 9) if text in tokenizer.decode(free.tokens[:j], skip_special_tokens=True))
    by_text = _sample(sampler, 1, seed=21, max_tokens=8, stop=[text]).sequences[0]
    assert (by_text.tokens, by_text.stop_reason) == (free.tokens[:end], "stop")


def test_compute_logprobs_and_prompt_top_k_equal_log_softmax(
    sampler: Any, reference: torch.nn.Module
) -> None:
    rows = _log_softmax(reference, PROMPT)[:-1]
    expected = rows.gather(1, torch.tensor(PROMPT[1:])[:, None])[:, 0]
    got = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()
    assert got[0] is None
    torch.testing.assert_close(torch.tensor(got[1:]), expected, rtol=1e-5, atol=1e-5)

    out = sampler.sample(
        types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=1, temperature=0.5),
        include_prompt_logprobs=True, topk_prompt_logprobs=3, prompt_logprobs_last_n=2,
    ).result()  # fmt: skip
    assert out.prompt_logprobs[: len(PROMPT) - 2] == [None] * (len(PROMPT) - 2)
    torch.testing.assert_close(torch.tensor(out.prompt_logprobs[-2:]), expected[-2:], rtol=1e-5, atol=1e-5)
    best, best_ids = rows[-2:].topk(3, dim=-1)
    for row, top in enumerate(out.topk_prompt_logprobs[-2:]):
        assert [t for t, _ in top] == best_ids[row].tolist()
        torch.testing.assert_close(torch.tensor([lp for _, lp in top]), best[row], rtol=1e-5, atol=1e-5)


def test_the_async_calls_give_what_the_sync_calls_give(sampler: Any) -> None:
    params = types.SamplingParams(max_tokens=4, seed=9, stop=[])
    prompt = types.ModelInput.from_ints(PROMPT)

    async def both() -> tuple[Any, Any]:
        return await asyncio.gather(sampler.sample(prompt, 2, params), sampler.compute_logprobs(prompt))

    sampled, logprobs = asyncio.run(both())
    assert [s.tokens for s in sampled.sequences] == [
        s.tokens for s in _sample(sampler, 2, seed=9, max_tokens=4).sequences
    ]
    assert logprobs == sampler.compute_logprobs(prompt).result()


@pytest.mark.parametrize(
    ("num_samples", "params", "prompt", "field"),
    [
        (10**6, {}, PROMPT, "num_samples"),
        (1, {"max_tokens": 0}, PROMPT, "sampling_params.max_tokens"),
        (1, {"max_tokens": 10**6}, PROMPT, "sampling_params.max_tokens"),
        (1, {"max_tokens": 512 - len(PROMPT) + 1}, PROMPT, "sampling_params.max_tokens"),  # past the context
        (1, {"temperature": -1.0}, PROMPT, "sampling_params.temperature"),
        (1, {"top_p": 0.0}, PROMPT, "sampling_params.top_p"),
        (1, {"top_k": -2}, PROMPT, "sampling_params.top_k"),
        (1, {"stop": [""]}, PROMPT, "sampling_params.stop"),
        (1, {}, [*PROMPT, 10**7], "prompt"),
        (1, {}, [], "prompt"),
        (1, {"max_tokens": None}, [1] * 600, "prompt"),  # fills the 512-token context: no room left
        (1, {"stop": [-3]}, PROMPT, "sampling_params.stop"),
    ],
)
def test_hostile_sample_requests_are_bad_requests_naming_the_field(
    sampler: Any, num_samples: int, params: dict[str, Any], prompt: list[int], field: str
) -> None:
    with pytest.raises(tinker.BadRequestError, match=field.replace(".", r"\.")):
        _sample(sampler, num_samples, prompt, **params)


def test_unknown_base_model_and_model_paths_are_refused(client: Any) -> None:
    with pytest.raises(tinker.BadRequestError, match="base_model"):
        client.create_sampling_client(base_model="../etc").result()
    with pytest.raises(tinker.NotFoundError, match="path"):
        client.create_sampling_client(model_path="tinker://model-absent/sampler_weights/001").result()


def test_a_training_clients_saved_weights_sample_its_adapter_and_only_its_adapter(
    client: Any, server: TinkerServer, reference: torch.nn.Module
) -> None:
    """`save_weights_and_get_sampling_client` after one optim_step: greedy samples and their logprobs equal
    those of the same LoRA step taken here with torch, and differ from the base model's. Only the adapter
    moved: the sampler is a frozen adapter next to the training one on the same base (one host)."""
    targets, weights = [*PROMPT[1:], 4], [1.0] * len(PROMPT)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(PROMPT),
        loss_fn_inputs={"target_tokens": targets, "weights": weights},
    )
    trainer = client.create_lora_training_client(base_model="tiny", rank=4, seed=7).result()
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=0.05, eps=1e-8)).result()
    live = trainer.save_weights_and_get_sampling_client().result()
    got = _sample(live, 1, temperature=0.0).sequences[0]
    trainer.forward_backward([datum], "cross_entropy").result()  # training on does not move the snapshot
    trainer.optim_step(types.AdamParams(learning_rate=0.05, eps=1e-8)).result()
    again = _sample(live, 1, temperature=0.0).sequences[0]

    trained = reference_model(server.state.model_paths["tiny"], AdapterSpec(4, 7))
    params = [p for p in trained.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    logits = trained(input_ids=torch.tensor([PROMPT])).logits[0].float()
    (-torch.log_softmax(logits, -1).gather(1, torch.tensor(targets)[:, None]).sum()).backward()
    optimizer.step()
    trained.eval()
    tokens: list[int] = []
    for _ in range(6):
        tokens.append(int(_log_softmax(trained, PROMPT + tokens)[-1].argmax()))
    assert got.tokens == tokens
    expected = _scores(trained, PROMPT, tokens, 1.0)
    torch.testing.assert_close(torch.tensor(got.logprobs), expected, rtol=1e-4, atol=1e-4)
    assert again.tokens == got.tokens and again.logprobs == got.logprobs
    base = _scores(reference, PROMPT, tokens, 1.0)
    assert (torch.tensor(got.logprobs) - base).abs().max() > 1e-3, "the adapter must change the logprobs"


@pytest.mark.parametrize(
    ("body", "status", "named"),
    [
        ({"sampling_session_id": "sampler-absent"}, 404, "sampling_session_id"),
        ({"sampling_params": {"stop": ["x", 3]}}, 400, "sampling_params.stop"),
        ({"prompt": {"chunks": [{"type": "image", "data": "", "format": "png"}]}}, 400, "prompt.chunks[0]"),
        ({"num_samples": True}, 400, "num_samples"),
        ({"sampling_params": {"temperature": "hot"}}, 400, "sampling_params.temperature"),
    ],
)
def test_hostile_bodies_the_sdk_never_sends_name_the_field(
    service: tuple[str, Path], sampler: Any, body: dict[str, Any], status: int, named: str
) -> None:
    """Over HTTP, one fault in a well-formed request: a 4xx whose `param` names the fault, never a 500."""
    request = {
        "sampling_session_id": sampler._sampling_session_id,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
        "sampling_params": {"max_tokens": 2},
        **body,
    }
    reply = httpx.post(f"{service[0]}/api/v1/asample", json=request, headers={"X-API-Key": KEY}, timeout=30)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == named


def test_get_sampler_names_the_sessions_base_model(service: tuple[str, Path], sampler: Any) -> None:
    """`GET samplers/{id}`: how the SDK learns the base model of a session it did not create."""
    headers = {"X-API-Key": KEY}
    reply = httpx.get(
        f"{service[0]}/api/v1/samplers/{sampler._sampling_session_id}", headers=headers, timeout=30
    )
    assert reply.json() == {
        "sampler_id": sampler._sampling_session_id,
        "base_model": "tiny",
        "model_path": None,
    }
    absent = httpx.get(f"{service[0]}/api/v1/samplers/sampler-absent", headers=headers, timeout=30)
    assert (absent.status_code, absent.json()["error"]["param"]) == (404, "sampling_session_id")
