"""Routing replay in the training engine: the routers route every token to the experts the rollout engine
recorded, padded and packed; the log-probs then follow the engine's; the gate keeps its gradient."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from routing_cases import moe_folder, record_rollout
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from quartet.config import Dtype, OptimConfig
from quartet.core.batch import Batch
from quartet.core.routing import ROUTED_EXPERTS, fed_response_mask, mismatch_share
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs, TrainingEngine
from quartet.engines.inputs import ModelInputs, build_inputs
from quartet.engines.routing_replay import RoutingReplay
from quartet.models.moe import moe_routers

PROMPTS = [[11, 12, 13, 14, 15, 16, 17], [20, 21], [30, 31, 32, 33], [40]]
MAX_NEW = [6, 10, 3, 8]


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe")
    return {"plain": moe_folder(root, "plain"), "tied": moe_folder(root, "tied", tie=1e-3)}


@pytest.fixture(scope="module")
def exact_rollout(moe_dirs: dict[str, Path]) -> Batch:
    """A rollout from a float32 engine: its routing is what a float32 trainer computes itself."""
    return record_rollout(moe_dirs["plain"], torch.float32, PROMPTS, MAX_NEW)


def trainer(folder: Path, replay: bool, packed: bool, **more: Any) -> TrainingEngine:
    spec = EngineSpec(
        str(folder),
        ModelKind.CAUSAL_LM,
        mixed_precision=Dtype.FLOAT32,
        routing_replay=replay,
        remove_padding=packed,
        fused_head=False,
        **more,
    )
    return TrainingEngine(spec)


def policy(engine: TrainingEngine, batch: Batch) -> ModelOutputs:
    return engine.forward_policy(batch, 1.0, MicroSpec(size=3), with_routing_mismatch=True)


@contextmanager
def routed_indices(engine: TrainingEngine) -> Iterator[list[list[torch.Tensor]]]:
    """Per router, the top-k indices it returned in each forward (what the experts were given)."""
    seen: list[list[torch.Tensor]] = [[] for _ in moe_routers(engine.module)]
    handles = [
        r.register_forward_hook(lambda m, a, out, i=i: seen[i].append(out[2].detach().clone()))
        for i, r in enumerate(moe_routers(engine.module))
    ]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def with_record(batch: Batch, record: torch.Tensor) -> Batch:
    """`batch` with another `routed_experts`."""
    return batch.drop(ROUTED_EXPERTS).union(Batch({ROUTED_EXPERTS: record}))


def flat_record(batch: Batch, packed: bool) -> torch.Tensor:
    """The batch's record in the routers' token order of one micro-batch of all its rows."""
    inputs = build_inputs(batch)
    assert inputs.routing is not None
    if packed:
        return inputs.routing[inputs.attention_mask != 0].long()
    return inputs.routing.reshape(-1, *inputs.routing.shape[2:]).long()


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_every_router_routes_to_the_recorded_experts(
    moe_dirs: dict[str, Path], exact_rollout: Batch, packed: bool
) -> None:
    engine = trainer(moe_dirs["plain"], replay=True, packed=packed)
    with routed_indices(engine) as seen:
        engine.forward_policy(exact_rollout, 1.0, MicroSpec(size=len(exact_rollout)))
    want = flat_record(exact_rollout, packed)
    for layer, calls in enumerate(seen):
        assert len(calls) == 1
        assert torch.equal(calls[0], want[:, layer])


def test_a_record_naming_an_expert_the_model_lacks_is_refused(
    moe_dirs: dict[str, Path], exact_rollout: Batch
) -> None:
    """A record from elsewhere (a replica over HTTP) is checked before any gather: 8 experts are 0..7."""
    bad = exact_rollout[ROUTED_EXPERTS].clone()
    bad[0, 0, 1, 0] = 8  # row 0 holds the longest prompt: column 0 is one of its real tokens
    with pytest.raises(ValueError, match="names experts 0..8; the model has 8"):
        policy(trainer(moe_dirs["plain"], replay=True, packed=False), with_record(exact_rollout, bad))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_replaying_an_exact_record_changes_nothing_and_a_shifted_one_does(
    moe_dirs: dict[str, Path], exact_rollout: Batch, packed: bool
) -> None:
    """A float32 engine's record is the trainer's own routing: replay gives the same log-probs as no replay
    (so the record sits on the right tokens) and no mismatch; a record shifted by one token does not."""
    free = policy(trainer(moe_dirs["plain"], replay=False, packed=packed), exact_rollout)
    engine = trainer(moe_dirs["plain"], replay=True, packed=packed)
    replayed = policy(engine, exact_rollout)
    assert free.logprobs is not None and replayed.logprobs is not None
    torch.testing.assert_close(replayed.logprobs, free.logprobs, atol=1e-5, rtol=0)
    mask = exact_rollout["response_mask"]
    assert free.routing_mismatch is not None and replayed.routing_mismatch is not None
    assert mismatch_share(free.routing_mismatch, mask) == 0.0
    assert mismatch_share(replayed.routing_mismatch, mask) == 0.0
    shifted = with_record(exact_rollout, exact_rollout[ROUTED_EXPERTS].roll(1, dims=1))
    moved = policy(engine, shifted)
    assert moved.logprobs is not None and moved.routing_mismatch is not None
    assert float((moved.logprobs - free.logprobs).abs().max()) > 1e-2
    assert mismatch_share(moved.routing_mismatch, mask) > 0.2


def test_replay_removes_the_drift_of_a_bfloat16_engine(moe_dirs: dict[str, Path]) -> None:
    """Near-tied experts: a bfloat16 engine routes some tokens elsewhere than a float32 trainer. Replayed,
    the trainer uses the engine's experts for every token, and its log-probs come closer to the engine's."""
    rollout = record_rollout(moe_dirs["tied"], torch.bfloat16, PROMPTS, MAX_NEW)
    fed = fed_response_mask(rollout["response_mask"])
    engine_lp = rollout["rollout_logprobs"]
    free = policy(trainer(moe_dirs["tied"], replay=False, packed=False), rollout)
    replayer = trainer(moe_dirs["tied"], replay=True, packed=False)
    with routed_indices(replayer) as seen:
        replayed = replayer.forward_policy(rollout, 1.0, MicroSpec(size=len(rollout)))
    assert free.logprobs is not None and replayed.logprobs is not None and free.routing_mismatch is not None
    assert mismatch_share(free.routing_mismatch, rollout["response_mask"]) > 0.05
    want = flat_record(rollout, packed=False)
    assert all(torch.equal(calls[0], want[:, layer]) for layer, calls in enumerate(seen))  # mismatch 0
    off = (engine_lp - free.logprobs).abs()[fed]
    on = (engine_lp - replayed.logprobs).abs()[fed]
    assert float(off.mean()) > 2 * float(on.mean())
    assert float(off.max()) > float(on.max())


@pytest.mark.parametrize("norm", [True, False], ids=["renormalised", "plain"])
def test_the_gate_gets_the_gradient_of_the_gathered_softmax(norm: bool) -> None:
    """Replayed weights are softmax(x W^T) at the recorded experts (renormalised over the k when the router
    says so), and the gate's gradient is theirs: checked against a float64 hand computation."""
    config = Qwen3MoeConfig(
        hidden_size=16, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=8, norm_topk_prob=norm
    )
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(config)
    torch.nn.init.normal_(block.gate.weight)
    tokens = 5
    x = torch.randn(tokens, 16)
    record = torch.stack([torch.randperm(6)[:3] for _ in range(tokens)])  # any experts, not the top ones
    c = torch.randn(tokens, 3)
    inputs = ModelInputs(
        input_ids=torch.zeros(1, tokens, dtype=torch.int64),
        attention_mask=torch.ones(1, tokens, dtype=torch.int64),
        position_ids=torch.arange(tokens).unsqueeze(0),
        response_width=1,
        response_mask=torch.ones(1, 1, dtype=torch.bool),
        routing=record.view(1, tokens, 1, 3).to(torch.uint8),
    )
    with RoutingReplay(block, replay=True).pass_(inputs, False, torch.device("cpu"), record=False):
        _, weights, indices = block.gate(x)
        (weights * c).sum().backward()
    assert torch.equal(indices, record)
    w64 = block.gate.weight.detach().double().requires_grad_(True)
    logits = x.double() @ w64.T
    probs = torch.exp(logits - logits.max(-1, keepdim=True).values)
    probs = probs / probs.sum(-1, keepdim=True)
    want = probs.gather(-1, record)
    if norm:
        want = want / want.sum(-1, keepdim=True)
    (want * c.double()).sum().backward()
    torch.testing.assert_close(weights.double(), want.detach(), atol=1e-6, rtol=1e-5)
    grad = block.gate.weight.grad
    assert grad is not None and float(grad.abs().max()) > 1e-3
    assert w64.grad is not None
    torch.testing.assert_close(grad.double(), w64.grad, atol=1e-6, rtol=1e-4)
    assert "forward" not in vars(block.gate)  # the patch is gone


def _pg_loss(out: ModelOutputs, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
    assert out.logprobs is not None
    mask = mb["response_mask"].to(out.logprobs.dtype)
    return -(out.logprobs * mb["advantages"] * mask).sum() / scale.tokens, {}


def test_the_update_replays_through_gradient_checkpointing(
    moe_dirs: dict[str, Path], exact_rollout: Batch
) -> None:
    """Checkpointing recomputes each layer's forward in the backward; the replay stays on there, so an update
    with a record far from the router's own choice equals the update without checkpointing, and moves the
    gates."""
    g = torch.Generator().manual_seed(0)
    routed = exact_rollout[ROUTED_EXPERTS]
    random_record = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(routed[..., 0].numel())])
    batch = with_record(exact_rollout, random_record.view(routed.shape).to(routed.dtype)).union(
        Batch({"advantages": torch.randn(exact_rollout["responses"].shape, generator=g)})
    )
    optim = OptimConfig(lr=1e-2, grad_clip=0.0)
    plain = trainer(moe_dirs["plain"], replay=True, packed=False, optim=optim, total_steps=1)
    ckpt = trainer(
        moe_dirs["plain"], replay=True, packed=False, optim=optim, total_steps=1, gradient_checkpointing=True
    )
    before = [r.weight.detach().clone() for r in moe_routers(plain.module)]
    for engine in (plain, ckpt):
        engine.train_step(batch, _pg_loss, MicroSpec(size=3))
    for b, r_plain, r_ckpt in zip(before, moe_routers(plain.module), moe_routers(ckpt.module), strict=True):
        assert float((r_plain.weight.detach() - b).abs().max()) > 1e-4  # the gate trained
        torch.testing.assert_close(r_ckpt.weight, r_plain.weight, atol=1e-6, rtol=1e-5)
    for p_plain, p_ckpt in zip(plain.module.parameters(), ckpt.module.parameters(), strict=True):
        torch.testing.assert_close(p_ckpt, p_plain, atol=1e-6, rtol=1e-5)


def test_replay_without_a_record_or_on_a_dense_model_is_refused(
    tiny_model_dir: Path, moe_dirs: dict[str, Path], exact_rollout: Batch
) -> None:
    with pytest.raises(ValueError, match="no MoE layers"):
        trainer(tiny_model_dir, replay=True, packed=False)
    engine = trainer(moe_dirs["plain"], replay=True, packed=False)
    with pytest.raises(ValueError, match="carries no routed_experts"):
        engine.forward_logprobs(exact_rollout.drop(ROUTED_EXPERTS), 1.0, MicroSpec(size=8))
    with pytest.raises(ValueError, match="sequence or tensor parallelism"):
        replace(engine.spec, sequence_parallel_size=2)
