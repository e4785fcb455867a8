"""One rank of the sequence-parallel case runs (spawned by test_ulysses_cases_dist.py), and the helpers that
compute the same quantities on one process.

Cases (one spawned run holds them all, so the test pays for one process group per layout):

- `policy-<mode>`: the policy with `remove_padding: false` under SP (the engine packs itself), its PPO loss
  plus an entropy bonus aggregated with each `LossAggMode`; gradients taken through `train_step`.
- `critic-<mode>`: the value model's values and its clipped value loss with each mode.
- `critic-step`: one real optimizer step of the critic (parameters and gradient norm).
- `mutant-<name>` (when asked): the policy's token-mean case with one deliberate defect patched in, HERE
  in the test worker (never a switch in library code); the test expects the exactness comparison to fail.

Gradients are read inside `train_step`: the engine's optimizer step is replaced, on this engine instance
only, by a capture of the full gradients, so the real path (row pooling, global counts, micro-batching,
loss times world size, FSDP reduction) is what is measured.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from engine_cases import make_batch

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch
from quartet.core.choices import LossAggMode, PolicyLoss
from quartet.core.loss_agg import aggregate_loss
from quartet.core.policy_loss import compute_policy_loss
from quartet.core.value_loss import compute_value_loss
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs, TrainingEngine, ulysses
from quartet.engines import loss_scale as loss_scale_module
from quartet.engines.dist import to_local_full
from quartet.engines.hf_modules import hf_model

PROMPTS = [5, 2, 7, 1, 4, 6, 3, 2]
RESPONSES = [3, 6, 1, 4, 2, 5, 2, 6]
MICRO = MicroSpec(size=4)
OPTIM = OptimConfig(lr=0.5, eps=1.0, weight_decay=0.0, grad_clip=0.0)
TEMPERATURE = 0.7
NORM = 8.0  # C of seq-mean-token-sum-norm
MODES = [m.value for m in LossAggMode]
SPLITS = {1: (0, 8), 2: (0, 5, 8), 4: (0, 3, 4, 6, 8)}
MUTANTS = ["a2a-identity", "a2a-reversed", "gather-sums", "counts-over-world"]


def full_batch() -> Batch:
    batch = make_batch(PROMPTS, RESPONSES)
    g = torch.Generator().manual_seed(7)
    shape = batch["responses"].shape
    extra = {"values": torch.randn(shape, generator=g), "returns": torch.randn(shape, generator=g)}
    return batch.union(Batch(extra, meta=batch.meta))  # the critic's old values, and its targets


def rank_rows(batch: Batch, rank: int, world: int) -> Batch:
    return batch.slice(SPLITS[world][rank], SPLITS[world][rank + 1])


def policy_engine(model_dir: str, sp: int) -> TrainingEngine:
    """The policy as configured with `remove_padding: false` (packed by the engine itself when sp > 1)."""
    spec = EngineSpec(model_dir, ModelKind.CAUSAL_LM, Dtype.FLOAT32, optim=OPTIM, sequence_parallel_size=sp)
    return TrainingEngine(spec)


def critic_engine(model_dir: str, sp: int) -> TrainingEngine:
    spec = EngineSpec(model_dir, ModelKind.VALUE, Dtype.FLOAT32, optim=OPTIM, sequence_parallel_size=sp)
    return TrainingEngine(spec)


def policy_loss(
    mode: str,
) -> Callable[[ModelOutputs, Batch, LossScale], tuple[torch.Tensor, Mapping[str, Any]]]:
    """On-policy PPO loss (old log-probs = the current ones, detached) minus 0.1 x entropy, both `mode`."""

    def fn(out: ModelOutputs, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, Mapping[str, Any]]:
        assert out.logprobs is not None and out.entropy is not None
        counts = {
            "global_token_count": scale.tokens,
            "global_seq_count": scale.sequences,
            "norm_constant": NORM,
        }
        mask = mb["response_mask"]
        agg = LossAggMode(mode)
        pg = compute_policy_loss(
            PolicyLoss.PPO,
            out.logprobs,
            out.logprobs.detach(),
            mb["advantages"],
            mask,
            agg_mode=agg,
            **counts,
        )
        return pg.loss - 0.1 * aggregate_loss(out.entropy, mask, agg, **counts), {}

    return fn


def value_loss(
    mode: str,
) -> Callable[[ModelOutputs, Batch, LossScale], tuple[torch.Tensor, Mapping[str, Any]]]:
    def fn(out: ModelOutputs, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, Mapping[str, Any]]:
        assert out.values is not None
        result = compute_value_loss(
            out.values, mb["values"], mb["returns"], mb["response_mask"], 0.5, agg_mode=LossAggMode(mode),
            global_token_count=scale.tokens, global_seq_count=scale.sequences, norm_constant=NORM,
        )  # fmt: skip
        return result.loss, {}

    return fn


def step_gradients(
    engine: TrainingEngine, batch: Batch, loss_fn: Any
) -> tuple[dict[str, torch.Tensor], float]:
    """Full parameter gradients and loss of one `train_step`, taken before (instead of) the optimizer step."""
    grads: dict[str, torch.Tensor] = {}

    def capture(optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, float]:
        for name, p in hf_model(engine.module).named_parameters():
            if p.grad is not None:
                grads[name] = to_local_full(p.grad).detach().clone()  # a collective: every rank calls it
        optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": 0.0, "lr": 0.0, "skipped_steps": 0.0}

    engine._optimizer_step = capture  # type: ignore[method-assign]
    try:
        metrics = engine.train_step(batch, loss_fn, MICRO, temperature=TEMPERATURE, with_entropy=True)
    finally:
        del engine._optimizer_step  # back to the class's method
    return grads, metrics["loss"]


def forward(engine: TrainingEngine, batch: Batch) -> dict[str, torch.Tensor]:
    if engine.spec.kind is ModelKind.VALUE:
        return {"values": engine.forward_values(batch, MICRO)}
    logprobs, entropy = engine.forward_logprobs(batch, TEMPERATURE, MICRO, with_entropy=True)
    assert entropy is not None
    return {"logprobs": logprobs, "entropy": entropy}


@contextmanager
def mutant(name: str, engine: TrainingEngine) -> Iterator[None]:
    """One deliberate defect, patched into the library modules for the block (this process only)."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, attr: str, value: Any) -> None:
        saved.append((owner, attr, owner.__dict__[attr]))
        setattr(owner, attr, value)

    exchange = ulysses._all_to_all
    group = ulysses.seq_group(engine.ctx)
    assert group is not None
    if name == "a2a-identity":  # no exchange at all: each rank keeps its own chunks
        patch(ulysses, "_all_to_all", lambda x, g: x.contiguous())
    elif name == "a2a-reversed":  # the received chunks in reverse rank order
        patch(ulysses, "_all_to_all", lambda x, g: exchange(x, g).flip(0).contiguous())
    elif name == "gather-sums":  # the gather's backward sums the group's gradients instead of slicing

        def summing(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
            total = grad.contiguous().clone()
            dist.all_reduce(total, group=group.group)
            start = sum(ctx.counts[: ctx.rank])
            return total[start : start + ctx.counts[ctx.rank]], None, None

        patch(ulysses._Gather, "backward", staticmethod(summing))
    elif name == "counts-over-world":  # token and row counts summed over every rank, not over "dp"

        def over_world(values: list[int], ctx: Any) -> list[int]:
            t = torch.tensor(values, dtype=torch.int64)
            dist.all_reduce(t)
            return [int(x) for x in t.tolist()]

        patch(loss_scale_module, "all_reduce_sum", over_world)
    else:
        raise ValueError(name)
    try:
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


def run_cases(
    rank: int, world: int, sp: int, port: int, dirs: dict[str, str], out: str, mutants: bool, modes: list[str]
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    mine = rank_rows(full_batch(), rank, world)
    results: dict[str, dict[str, Any]] = {}
    policy = policy_engine(dirs["policy"], sp)
    assert policy.spec.packs and not policy.spec.remove_padding and policy.ctx.dp == world // sp
    results["policy-fwd"] = forward(policy, mine)
    for mode in modes:
        grads, loss = step_gradients(policy, mine, policy_loss(mode))
        results[f"policy-{mode}"] = {"grads": grads, "loss": loss}
    for name in MUTANTS if mutants else []:
        with mutant(name, policy):
            fwd = forward(policy, mine)
            grads, loss = step_gradients(policy, mine, policy_loss(LossAggMode.TOKEN_MEAN.value))
        results[f"mutant-{name}"] = {"fwd": fwd, "grads": grads, "loss": loss}
    critic = critic_engine(dirs["value"], sp)
    results["critic-fwd"] = forward(critic, mine)
    for mode in modes:
        grads, loss = step_gradients(critic, mine, value_loss(mode))
        results[f"critic-{mode}"] = {"grads": grads, "loss": loss}
    metrics = critic.train_step(mine, value_loss(LossAggMode.TOKEN_MEAN.value), MICRO)
    params = {k: to_local_full(v).detach().clone() for k, v in hf_model(critic.module).state_dict().items()}
    results["critic-step"] = {"params": params, "grad_norm": metrics["grad_norm"], "loss": metrics["loss"]}
    torch.save(results, Path(out) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
