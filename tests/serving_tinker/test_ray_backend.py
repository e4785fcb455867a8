"""`backend: ray`: each base model in a Ray actor of its own, driven by the real SDK through the service.

The numbers must equal the in-process backend's (the same adapter, the same step), and a host actor that
dies must fail its calls with an error naming the base, while the service keeps answering.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
from tinker import types  # noqa: E402

from quartet.serving.tinker.adapters import AdapterSpec, reference_model  # noqa: E402
from quartet.serving.tinker.ray_hosts import RayHost  # noqa: E402
from quartet.serving.tinker.server import TinkerServer  # noqa: E402
from quartet.serving.tinker.service_config import TinkerServiceConfig  # noqa: E402

KEY = "tml-ray-backend"
TOKENS, TARGETS = [5, 17, 33, 2, 9, 41], [17, 33, 2, 9, 41, 8]


@pytest.fixture(scope="module")
def ray_service(ray_cluster: None, tiny_model_dir: Path) -> Iterator[tuple[TinkerServer, Any]]:
    config = TinkerServiceConfig(
        models={"tiny": str(tiny_model_dir)}, backend="ray", ray_namespace="quartet-tests", torch_threads=1
    )
    server = TinkerServer(config.models, KEY, config=config)
    url = server.start_in_thread()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        client = tinker.ServiceClient(base_url=url, api_key=KEY)
    yield server, client
    client.close("success").result(timeout=30)
    server.stop_thread(grace_s=5)


def _datum() -> Any:
    inputs = {"target_tokens": TARGETS}
    return types.Datum(model_input=types.ModelInput.from_ints(TOKENS), loss_fn_inputs=inputs)


def test_a_step_on_the_ray_host_equals_torch_in_process(
    ray_service: tuple[TinkerServer, Any], tiny_model_dir: Path
) -> None:
    server, client = ray_service
    trainer = client.create_lora_training_client(base_model="tiny", rank=4, seed=3).result()
    assert isinstance(server.state.hosts["tiny"].host, RayHost)
    trainer.forward_backward([_datum()], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=0.05)).result()
    got = trainer.forward([_datum()], "cross_entropy").result().metrics["loss:sum"]

    import torch

    module = reference_model(tiny_model_dir, AdapterSpec(4, 3))
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.05, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)

    def loss() -> torch.Tensor:
        logits = module(input_ids=torch.tensor([TOKENS])).logits[0]
        return -torch.log_softmax(logits, -1)[torch.arange(len(TARGETS)), torch.tensor(TARGETS)].sum()

    loss().backward()
    optimizer.step()
    with torch.no_grad():
        expected = float(loss())
    assert got == pytest.approx(expected, rel=1e-5)

    # sampling runs on the Ray host too: the snapshot's greedy tokens and their logprobs are the trained
    # model's (the logprobs move with the step even where the argmax does not; the base's differ)
    sampler = trainer.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=5, temperature=0.0, stop=[])
    sequence = sampler.sample(types.ModelInput.from_ints(TOKENS), 1, params).result().sequences[0]
    tokens: list[int] = []
    logprobs: list[float] = []
    with torch.no_grad():
        for _ in range(5):
            logits = torch.log_softmax(module(input_ids=torch.tensor([TOKENS + tokens])).logits[0, -1], -1)
            tokens.append(int(logits.argmax()))
            logprobs.append(float(logits[tokens[-1]]))
    assert list(sequence.tokens) == tokens
    assert sequence.logprobs == pytest.approx(logprobs, abs=1e-4)
    base = client.create_sampling_client(base_model="tiny").result()
    untrained = base.sample(types.ModelInput.from_ints(TOKENS), 1, params).result().sequences[0]
    assert untrained.logprobs != pytest.approx(logprobs, abs=1e-3), "the adapter must move the logprobs"


@pytest.mark.slow
def test_a_dead_host_fails_its_calls_naming_the_base_and_the_service_answers(
    ray_service: tuple[TinkerServer, Any],
) -> None:
    import ray

    server, client = ray_service
    trainer = client.create_lora_training_client(base_model="tiny", rank=2).result()
    host = server.state.hosts["tiny"].host
    assert isinstance(host, RayHost)
    ray.kill(host.actor)
    with pytest.raises(tinker.RequestFailedError, match="Ray host of base model 'tiny' died"):
        trainer.forward([_datum()], "cross_entropy").result()
    # the service still answers, and a new client on that base gets a new host
    fresh = client.create_lora_training_client(base_model="tiny", rank=2).result()
    assert fresh.forward([_datum()], "cross_entropy").result().metrics["loss:sum"] > 0
    assert server.state.hosts["tiny"].host is not host
    with pytest.raises(tinker.NotFoundError, match="model_id"):  # the dead host's clients are gone
        trainer.forward([_datum()], "cross_entropy").result()
