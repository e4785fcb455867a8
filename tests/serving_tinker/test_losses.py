"""The Tinker built-in losses and `forward_backward_custom`, driven by the official SDK (issue 51).

Each loss's `loss:sum`, per-datum `logprobs` and gradient are checked against the loss's formula as the
Tinker docs write it, computed here with torch on a model built with the same spec and seed as the
service's. The gradient is checked twice: its norm (optim_step's `grad_norm:mean`, taken before the
update) and the logprobs after one AdamW step against torch's AdamW on the test's own copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
from tinker import types  # noqa: E402

from quartet.serving.tinker.adapters import AdapterSpec, reference_model  # noqa: E402

KEY = "tml-quartet-test-key"  # the service fixture's (conftest.py)
RANK, SEED = 4, 7
TOKENS = [5, 17, 33, 2, 9, 41]
TARGETS = [17, 33, 2, 9, 41, 8]
ADVANTAGES = [0.0, 1.0, -1.0, 0.5, -0.5, 2.0]
DELTAS = [0.0, -0.5, 0.5, 0.1, -0.1, 1.0]
"""Sampling logprobs q = (the model's logprobs) + DELTAS, so the ratios are exp(-DELTAS): some clip."""
MASK = [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
LR, EPS = 0.05, 1e-8


def _trainer(client: Any) -> Any:
    return client.create_lora_training_client(base_model="tiny", rank=RANK, seed=SEED).result()


def _reference(model_dir: Path) -> torch.nn.Module:
    """The service's starting model, built independently with the same spec and seed."""
    return reference_model(model_dir, AdapterSpec(RANK, SEED))  # the SDK's defaults: attn, mlp, unembed


def _logprobs(module: torch.nn.Module, tokens: list[int], targets: torch.Tensor) -> torch.Tensor:
    """log p(target) at each position: (N,) for 1-D targets, (N, K) for 2-D."""
    logits = module(input_ids=torch.tensor([tokens])).logits[0].float()
    full = torch.log_softmax(logits, -1)
    rows = torch.arange(len(tokens))
    return full[rows, targets] if targets.ndim == 1 else full[rows[:, None], targets]


def _formula(loss_fn: str, lp: torch.Tensor, q: torch.Tensor, config: dict[str, float]) -> torch.Tensor:
    """The docs' definition of each RL loss (tinker-docs.thinkingmachines.ai/tinker/losses/...)."""
    adv = torch.tensor(ADVANTAGES)
    low, high = config.get("clip_low_threshold"), config.get("clip_high_threshold")
    if loss_fn == "importance_sampling":
        return -(torch.exp(lp - q) * adv).sum()
    if loss_fn == "ppo":
        ratio = torch.exp(lp - q)
        return -torch.min(ratio * adv, torch.clamp(ratio, low, high) * adv).sum()
    if loss_fn == "cispo":
        return -(torch.clamp(torch.exp(lp - q), low, high).detach() * lp * adv).sum()
    if loss_fn == "dro":
        return -(lp * adv - 0.5 * config["beta"] * (lp - q) ** 2).sum()
    assert loss_fn == "gspo"
    keep = torch.tensor(MASK) != 0
    ratio = torch.exp((lp.detach() - q)[keep].mean() + lp - lp.detach())
    return -torch.min(ratio * adv, torch.clamp(ratio, low, high) * adv).sum()


def _grad_norm(module: torch.nn.Module) -> float:
    grads = [p.grad.double().norm() for p in module.parameters() if p.requires_grad and p.grad is not None]
    return float(torch.stack(grads).norm())


def _adamw_step(module: torch.nn.Module) -> None:
    params = [p for p in module.parameters() if p.requires_grad]
    torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=EPS, weight_decay=0.0).step()


def _got(output: Any) -> torch.Tensor:
    return torch.as_tensor(output["logprobs"].to_numpy()).reshape(output["logprobs"].shape)


@pytest.mark.parametrize(
    ("loss_fn", "config"),
    [
        ("importance_sampling", {}),
        ("ppo", {}),
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}),
        ("cispo", {}),
        ("cispo", {"clip_low_threshold": 0.7, "clip_high_threshold": 1.2}),
        ("dro", {"beta": 0.05}),
        ("gspo", {}),
        ("gspo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    ],
)
def test_a_loss_its_outputs_and_its_gradient_equal_the_docs_formula(
    client: Any, service: tuple[str, Path], loss_fn: str, config: dict[str, float]
) -> None:
    module = _reference(service[1])
    lp = _logprobs(module, TOKENS, torch.tensor(TARGETS))
    q = lp.detach() + torch.tensor(DELTAS)
    defaults = {"ppo": (0.8, 1.2), "cispo": (0.0, 4.0), "gspo": (0.8, 1.2)}.get(loss_fn)
    full = dict(zip(("clip_low_threshold", "clip_high_threshold"), defaults or (), strict=False)) | config
    inputs = {"target_tokens": TARGETS, "logprobs": q.tolist(), "advantages": ADVANTAGES}
    if loss_fn == "gspo":
        inputs["sequence_ratio_mask"] = MASK
    datum = types.Datum(model_input=types.ModelInput.from_ints(TOKENS), loss_fn_inputs=inputs)

    trainer = _trainer(client)
    first = trainer.forward_backward([datum], loss_fn, config or None).result()
    step = trainer.optim_step(types.AdamParams(learning_rate=LR, eps=EPS)).result()
    after = trainer.forward([datum], loss_fn, config or None).result()

    loss = _formula(loss_fn, lp, q, full)
    assert first.metrics["loss:sum"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(_got(first.loss_fn_outputs[0]), lp.detach(), rtol=1e-5, atol=1e-5)
    loss.backward()
    assert step.metrics["grad_norm:mean"] == pytest.approx(_grad_norm(module), rel=1e-4)
    _adamw_step(module)
    with torch.no_grad():
        lp_after = _logprobs(module, TOKENS, torch.tensor(TARGETS))
        expected = _formula(loss_fn, lp_after, q, full)
    assert float((lp_after - lp.detach()).abs().max()) > 1e-3, "the step must move the logprobs"
    torch.testing.assert_close(_got(after.loss_fn_outputs[0]), lp_after, rtol=1e-5, atol=1e-5)
    assert after.metrics["loss:sum"] == pytest.approx(float(expected), rel=1e-5, abs=1e-6)


def test_clipping_bites_in_the_cases_above() -> None:
    """Without a token whose clipped term differs from its unclipped one, a clipped case would test no
    more than importance_sampling: count them for each (low, high) the cases use."""
    ratios, adv = np.exp(-np.asarray(DELTAS)), np.asarray(ADVANTAGES)
    for low, high in ((0.8, 1.2), (0.9, 1.05)):  # ppo: min(r A, clip(r) A) != r A
        assert (np.minimum(ratios * adv, np.clip(ratios, low, high) * adv) != ratios * adv).sum() >= 2
    assert (np.clip(ratios, 0.7, 1.2) != ratios).sum() >= 2  # cispo's clipped coefficient
    s = np.exp(-np.mean(np.asarray(DELTAS)[np.asarray(MASK) != 0]))  # gspo's sequence ratio
    assert 0.8 < s < 0.9 and (adv < 0).any()  # inside the defaults; below 0.9: A < 0 tokens clip


def _two_d_data() -> tuple[list[Any], list[torch.Tensor], list[torch.Tensor]]:
    """Two datums with several targets per position: K = 3 sent dense, K = 4 sent as the SDK's sparse CSR
    (a raw 2-D torch tensor, mostly zeros)."""
    rng = np.random.default_rng(3)
    dense_targets = torch.as_tensor(rng.integers(0, 64, size=(6, 3)))
    dense_weights = torch.as_tensor(rng.uniform(0, 1, size=(6, 3)).astype(np.float32))
    sparse_targets = torch.zeros((6, 4), dtype=torch.int64)
    sparse_targets[4:] = torch.tensor([[3, 7, 1, 9], [11, 2, 5, 4]])
    sparse_weights = torch.zeros((6, 4))
    sparse_weights[4:] = torch.tensor([[0.5, 0.25, 0.125, 1.0], [1.0, 0.75, 0.5, 2.0]])
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(TOKENS),
            loss_fn_inputs={
                "target_tokens": types.TensorData.from_torch(dense_targets),
                "weights": types.TensorData.from_torch(dense_weights),
            },
        ),
        types.Datum(
            model_input=types.ModelInput.from_ints(TOKENS),
            loss_fn_inputs={"target_tokens": sparse_targets, "weights": sparse_weights},
        ),
    ]
    for name in ("target_tokens", "weights"):
        assert data[1].loss_fn_inputs[name].sparse_crow_indices is not None, "the SDK must send it sparse"
    return data, [dense_targets, sparse_targets], [dense_weights, sparse_weights]


def test_cross_entropy_with_several_targets_per_position(client: Any, service: tuple[str, Path]) -> None:
    data, targets, weights = _two_d_data()
    out = _trainer(client).forward_backward(data, "cross_entropy").result()
    with torch.no_grad():
        module = _reference(service[1])
        lps = [_logprobs(module, TOKENS, t) for t in targets]
    expected = sum(float(-(lp * w).sum()) for lp, w in zip(lps, weights, strict=True))
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    for output, lp in zip(out.loss_fn_outputs, lps, strict=True):
        assert output["logprobs"].shape == list(lp.shape)
        torch.testing.assert_close(_got(output), lp, rtol=1e-5, atol=1e-5)


def _cross_entropy_like(data: list[Any], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
    """A client-side loss equal to cross_entropy: sum over datums of -(weights * logprobs)."""
    pairs = zip(data, logprobs, strict=True)
    terms = [-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in pairs]
    loss = torch.stack(terms).sum()
    return loss, {"custom_ce": float(loss.detach())}


def _neg_ll(logprobs: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = -(logprobs * weights).sum()
    return loss, {"custom/neg_ll:sum": loss}


def _step(trainer: Any, fb: Any, data: list[Any]) -> tuple[float, float, torch.Tensor]:
    """(loss:sum, grad norm, logprobs after one AdamW step) of a submitted forward_backward future."""
    loss = fb.result().metrics["loss:sum"]
    norm = trainer.optim_step(types.AdamParams(learning_rate=LR, eps=EPS)).result().metrics["grad_norm:mean"]
    after = trainer.forward(data, "cross_entropy").result()
    return loss, norm, torch.cat([_got(o).reshape(-1) for o in after.loss_fn_outputs])


def test_forward_backward_custom_equal_to_cross_entropy_steps_like_it(client: Any) -> None:
    """A callable and a `create_custom_loss` handle (kept client-side: custom_loss_server_side is false),
    both equal to cross_entropy, give cross_entropy's loss, gradient and step; also with 2-D targets,
    whose backward weights the SDK sends as sparse CSR."""
    one_d = [
        types.Datum(
            model_input=types.ModelInput.from_ints(TOKENS),
            loss_fn_inputs={"target_tokens": TARGETS, "weights": [0.0, 1.0, 1.0, 0.5, 1.0, 2.0]},
        )
    ]
    handle = client.create_custom_loss(_neg_ll, input_ranks={"logprobs": 1, "weights": 1}).result()
    assert handle.loss_id is None, "the service said custom_loss_server_side: false"
    two_d = _two_d_data()[0]
    for data, custom in ((one_d, _cross_entropy_like), (one_d, handle), (two_d, _cross_entropy_like)):
        builtin = _trainer(client)
        expected = _step(builtin, builtin.forward_backward(data, "cross_entropy"), data)
        trainer = _trainer(client)
        got = _step(trainer, trainer.forward_backward_custom(data, custom), data)
        assert got[0] == pytest.approx(expected[0], rel=1e-5)
        assert got[1] == pytest.approx(expected[1], rel=1e-5)
        torch.testing.assert_close(got[2], expected[2], rtol=1e-5, atol=1e-5)


def _rl_inputs(**changes: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = {"target_tokens": TARGETS, "logprobs": [-1.0] * 6, "advantages": ADVANTAGES}
    inputs.update(changes)
    return {k: v for k, v in inputs.items() if v is not None}


@pytest.mark.parametrize(
    ("loss_fn", "inputs", "config", "field"),
    [
        ("no_such_loss", _rl_inputs(), None, r"loss_fn: 'no_such_loss' is not a served loss"),
        ("custom", _rl_inputs(), {"loss_id": "l-1"}, r"loss_fn: 'custom' is not served.*model-written code"),
        ("stable_reinforce", _rl_inputs(), None, r"loss_fn: 'stable_reinforce' is not served"),
        ("ppo", _rl_inputs(advantages=None), None, r"data\[0\]\.loss_fn_inputs\.advantages: missing"),
        ("ppo", _rl_inputs(advantages=ADVANTAGES[:4]), None, r"data\[0\]\.loss_fn_inputs\.advantages: shape"),
        ("ppo", _rl_inputs(advantages=[0, float("nan"), 1, 1, 1, 1]), None, r"advantages: holds a NaN"),
        ("ppo", _rl_inputs(), {"clip_ratio": 0.2}, r"loss_fn_config\.clip_ratio: ppo does not take"),
        ("ppo", _rl_inputs(), {"clip_low_threshold": -0.1}, r"loss_fn_config\.clip_low_threshold: must lie"),
        ("cispo", _rl_inputs(), {"clip_high_threshold": 0.5}, r"loss_fn_config\.clip_high_threshold"),
        ("dro", _rl_inputs(), None, r"loss_fn_config\.beta: missing"),
        ("dro", _rl_inputs(), {"beta": "high"}, r"loss_fn_config\.beta: must be a finite number"),
        ("ppo", _rl_inputs(), {"clip_high_threshold": float("inf")}, r"threshold: must be a finite"),
        ("gspo", _rl_inputs(sequence_ratio_mask=[0.0] * 6), None, r"sequence_ratio_mask: marks no token"),
        ("importance_sampling", _rl_inputs(weights=[1.0] * 6), None, r"loss_fn_inputs\.weights: importance"),
        ("cross_entropy", {"target_tokens": TARGETS, "weights": [1.0] * 5}, None, r"loss_fn_inputs\.weights"),
        (
            "cross_entropy",
            {"target_tokens": types.TensorData.from_numpy(np.asarray(TARGETS, dtype=np.float32))},
            None,
            r"target_tokens: must be int64 token ids",
        ),
    ],
)
def test_a_bad_loss_request_is_a_400_naming_the_field(
    client: Any, loss_fn: str, inputs: dict[str, Any], config: dict[str, Any] | None, field: str
) -> None:
    trainer = _trainer(client)
    datum = types.Datum(model_input=types.ModelInput.from_ints(TOKENS), loss_fn_inputs=inputs)
    with pytest.raises(tinker.BadRequestError, match=field):
        trainer.forward([datum], loss_fn, config).result()


def test_a_loss_that_overflows_fails_naming_the_datum_and_leaves_no_gradient(client: Any) -> None:
    """exp(lp - q) overflows float32 for q = -1e4: the request fails (the SDK's RequestFailedError, a user
    error naming the datum) before that datum's backward, and the good datum before it gives its gradient
    back, so the next optim_step finds no gradient at all."""
    trainer = _trainer(client)
    ok = types.Datum(model_input=types.ModelInput.from_ints(TOKENS), loss_fn_inputs=_rl_inputs())
    bad = types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS), loss_fn_inputs=_rl_inputs(logprobs=[-1e4] * 6)
    )
    with pytest.raises(tinker.RequestFailedError, match=r"data\[1\]: the importance_sampling loss is"):
        trainer.forward_backward([ok, bad], "importance_sampling").result()
    assert trainer.optim_step(types.AdamParams(learning_rate=LR)).result().metrics["grad_norm:mean"] == 0.0


def _raw_forward(service: tuple[str, Path], sparse: dict[str, Any], shape: list[int]) -> httpx.Response:
    """A forward request whose `weights` is a hand-made sparse tensor, straight over HTTP."""
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardRequest(model_id="model-any", loss_fn="cross_entropy", forward_only=True)
    datum = msg.data.add()
    datum.model_input.add().encoded_text.tokens = np.asarray(TOKENS, dtype="<i4").tobytes()
    datum.loss_fn_inputs["target_tokens"].dtype = 2
    datum.loss_fn_inputs["target_tokens"].dense = np.zeros((6, 2), dtype="<i8").tobytes()
    datum.loss_fn_inputs["target_tokens"].shape.extend([6, 2])
    weights = datum.loss_fn_inputs["weights"]
    weights.dtype = 1
    weights.shape.extend(shape)
    weights.sparse_csr.values = np.asarray(sparse["values"], dtype="<f4").tobytes()
    weights.sparse_csr.crow_indices = np.asarray(sparse["crow"], dtype="<i8").tobytes()
    weights.sparse_csr.col_indices = np.asarray(sparse["col"], dtype="<i8").tobytes()
    headers = {"X-API-Key": KEY, "Content-Type": "application/x-protobuf"}
    return httpx.post(f"{service[0]}/api/v1/forward", content=msg.SerializeToString(), headers=headers)


@pytest.mark.parametrize(
    ("sparse", "shape", "problem"),
    [
        ({"values": [1.0], "crow": [0, 0, 0, 0, 0, 1, 1], "col": [5]}, [6, 2], "col_indices must lie"),
        ({"values": [1.0], "crow": [0, 1], "col": [0]}, [6, 2], "crow_indices must rise"),
        ({"values": [1.0, 2.0], "crow": [0, 0, 0, 0, 0, 2, 2], "col": [1, 1]}, [6, 2], "no entry twice"),
        ({"values": [], "crow": [0], "col": []}, [2**20, 2**20], "is over"),
        ({"values": [], "crow": [0], "col": []}, [6, -2], "negative dimension"),
    ],
)
def test_a_malformed_sparse_tensor_is_a_400_naming_it(
    service: tuple[str, Path], sparse: dict[str, Any], shape: list[int], problem: str
) -> None:
    reply = _raw_forward(service, sparse, shape)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "data[0].loss_fn_inputs.weights"
    assert problem in reply.json()["error"]["message"]


def test_create_custom_loss_is_refused_saying_why(service: tuple[str, Path]) -> None:
    reply = httpx.post(
        f"{service[0]}/api/v1/create_custom_loss", json={}, headers={"X-API-Key": KEY}, timeout=30
    )
    assert reply.status_code == 404
    assert "model-written code does not run" in reply.json()["error"]["message"]
    config = httpx.post(f"{service[0]}/api/v1/client/config", json={}, headers={"X-API-Key": KEY}, timeout=30)
    assert config.json()["custom_loss_server_side"] is False
