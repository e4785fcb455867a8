"""`quartet serve tinker` driven by the official `tinker` SDK (issue 51, first slice).

A real `TinkerServer` on a local port, the real `tinker.ServiceClient`, the tiny model. The expected numbers
come from torch directly on a model built with the same spec and seed (the SDK cannot read weights back, so
an update is checked through the loss and logprobs it produces). Skipped, saying why, where the `tinker`
extra is not installed: `make install-tinker` (pip install -e '.[dev,tinker]' -c constraints.txt) puts it in.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
from tinker import types  # noqa: E402

from quartet.serving.tinker.adapters import AdapterSpec, reference_model  # noqa: E402

KEY = "tml-quartet-test-key"  # the service fixture's (conftest.py)

RANK, SEED = 4, 7
TOKENS = [5, 17, 33, 2, 9, 41]
TARGETS = [17, 33, 2, 9, 41, 8]
WEIGHTS = [0.0, 1.0, 1.0, 0.5, 1.0, 2.0]


def _training_client(client: Any) -> Any:
    return client.create_lora_training_client(base_model="tiny", rank=RANK, seed=SEED).result()


def _datum(tokens: list[int] = TOKENS, targets: list[int] = TARGETS) -> Any:
    inputs = {"target_tokens": targets, "weights": WEIGHTS[: len(targets)]}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def _reference(model_dir: Path) -> torch.nn.Module:
    """The service's starting model, built independently with the same spec and seed."""
    return reference_model(model_dir, AdapterSpec(RANK, SEED))  # the SDK's defaults: attn, mlp, unembed


def _torch_cross_entropy(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    logits = module(input_ids=torch.tensor([TOKENS])).logits[0]
    logprobs = torch.log_softmax(logits.float(), -1)[torch.arange(len(TARGETS)), torch.tensor(TARGETS)]
    return -(logprobs * torch.tensor(WEIGHTS)).sum(), logprobs


def test_cross_entropy_of_forward_backward_equals_torch(client: Any, service: tuple[str, Path]) -> None:
    out = _training_client(client).forward_backward([_datum()], "cross_entropy").result()
    with torch.no_grad():
        loss, logprobs = _torch_cross_entropy(_reference(service[1]))
    assert out.metrics["loss:sum"] == pytest.approx(float(loss), rel=1e-5)
    got = torch.as_tensor(out.loss_fn_outputs[0]["logprobs"].to_numpy())
    torch.testing.assert_close(got, logprobs, rtol=1e-5, atol=1e-5)


def test_optim_step_equals_torch_adamw(client: Any, service: tuple[str, Path]) -> None:
    adam = types.AdamParams(learning_rate=0.05, beta1=0.8, beta2=0.9, eps=1e-8, weight_decay=0.01)
    trainer = _training_client(client)
    trainer.forward_backward([_datum()], "cross_entropy").result()
    trainer.optim_step(adam).result()
    after = trainer.forward([_datum()], "cross_entropy").result()

    module = _reference(service[1])
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.05, betas=(0.8, 0.9), eps=1e-8, weight_decay=0.01)
    before, _ = _torch_cross_entropy(module)
    before.backward()
    optimizer.step()
    with torch.no_grad():
        expected, logprobs = _torch_cross_entropy(module)
    assert abs(float(expected) - float(before.detach())) > 1e-3, (
        "the step must move the loss for this check to bite"
    )
    assert after.metrics["loss:sum"] == pytest.approx(float(expected), rel=1e-5)
    got = torch.as_tensor(after.loss_fn_outputs[0]["logprobs"].to_numpy())
    torch.testing.assert_close(got, logprobs, rtol=1e-5, atol=1e-5)


def test_a_wrong_api_key_is_the_sdks_authentication_error(service: tuple[str, Path]) -> None:
    with pytest.raises(tinker.AuthenticationError, match="X-API-Key"):
        stranger = tinker.ServiceClient(base_url=service[0], api_key="tml-wrong-key")
        stranger.create_lora_training_client(base_model="tiny", rank=RANK).result()


def test_a_malformed_datum_is_the_sdks_bad_request_naming_the_field(client: Any) -> None:
    trainer = _training_client(client)
    short = _datum(targets=TARGETS[:-2])
    with pytest.raises(tinker.BadRequestError, match=r"data\[0\]\.loss_fn_inputs\.target_tokens"):
        trainer.forward_backward([short], "cross_entropy").result()
    huge = _datum(targets=[*TARGETS[:-1], 10**9])
    with pytest.raises(tinker.BadRequestError, match=r"data\[0\]\.loss_fn_inputs\.target_tokens"):
        trainer.forward_backward([huge], "cross_entropy").result()


def test_a_call_not_served_yet_names_itself(client: Any) -> None:
    trainer = _training_client(client)
    with pytest.raises(tinker.NotFoundError, match="save_weights_external is not served yet"):
        trainer.save_weights_external("step-1").result()
    with pytest.raises(tinker.BadRequestError, match="loss_fn: 'stable_reinforce' is not served"):
        trainer.forward_backward([_datum()], "stable_reinforce").result()


@pytest.mark.parametrize(
    ("path", "body", "status", "named"),
    [
        ("forward_backward", b"\xff\xfenot protobuf", 400, "body"),
        ("optim_step", b'{"model_id": "model-absent", "adam_params": {}}', 404, "model_id"),
        ("optim_step", b"[1, 2", 400, "body"),
        ("create_model", b'{"base_model": "../etc", "lora_config": {"rank": 4}}', 400, "base_model"),
        ("asample", b"{}", 400, "sampling_params"),
        ("save_weights", b"{}", 404, "model_id"),
        ("load_weights", b'{"path": "tinker://../../etc/passwd"}', 400, "path"),
    ],
)
def test_hostile_bodies_answer_4xx_naming_the_field(
    service: tuple[str, Path], path: str, body: bytes, status: int, named: str
) -> None:
    """Bodies the SDK never sends, straight over HTTP: a 4xx whose `param` names the fault, never a 500."""
    headers = {
        "X-API-Key": KEY,
        "Content-Type": "application/x-protobuf" if path == "forward_backward" else "application/json",
    }
    reply = httpx.post(f"{service[0]}/api/v1/{path}", content=body, headers=headers, timeout=30)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == named


def test_calls_submitted_before_waiting_run_in_order_and_can_be_awaited(client: Any) -> None:
    """The SDK's recommended pipelining: forward_backward, optim_step and forward sent at once, then awaited
    in an event loop. The result equals the same steps waited one by one (so optim_step ran in between)."""
    adam = types.AdamParams(learning_rate=0.05)
    one_by_one = _training_client(client)
    one_by_one.forward_backward([_datum()], "cross_entropy").result()
    one_by_one.optim_step(adam).result()
    expected = one_by_one.forward([_datum()], "cross_entropy").result().metrics["loss:sum"]

    async def pipelined() -> tuple[float, float]:
        trainer = _training_client(client)
        first = trainer.forward_backward([_datum()], "cross_entropy")
        step = trainer.optim_step(adam)
        after = trainer.forward([_datum()], "cross_entropy")
        before = (await first).metrics["loss:sum"]
        await step
        return before, (await after).metrics["loss:sum"]

    before, after = asyncio.run(pipelined())
    assert after == pytest.approx(expected, rel=1e-6)
    assert abs(after - before) > 1e-3


def test_datums_of_different_lengths_batched_equal_each_sent_alone(client: Any) -> None:
    """The service pads a request's datums into one forward: each datum's logprobs, the loss and the
    gradient (its norm at optim_step) must equal those of the datums sent one request each."""
    rows = [(TOKENS, TARGETS), (TOKENS[:3], TARGETS[:3]), ([7, 7, 19, 23, 3, 11, 12, 13, 14], [3] * 9)]
    data = [
        types.Datum(model_input=types.ModelInput.from_ints(t), loss_fn_inputs={"target_tokens": y})
        for t, y in rows
    ]
    together, alone = _training_client(client), _training_client(client)
    out = together.forward_backward(data, "cross_entropy").result()
    singles = [alone.forward_backward([d], "cross_entropy").result() for d in data]
    for i, single in enumerate(singles):
        got = out.loss_fn_outputs[i]["logprobs"].to_numpy()
        expected = single.loss_fn_outputs[0]["logprobs"].to_numpy()
        assert got.shape == (len(rows[i][0]),)
        torch.testing.assert_close(torch.as_tensor(got), torch.as_tensor(expected), rtol=1e-5, atol=1e-5)
    assert out.metrics["loss:sum"] == pytest.approx(sum(s.metrics["loss:sum"] for s in singles), rel=1e-5)
    step = types.AdamParams(learning_rate=0.0)
    norms = [t.optim_step(step).result().metrics["grad_norm:mean"] for t in (together, alone)]
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)
