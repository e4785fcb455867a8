"""Workloads whose memory the planner tests measure: the real quartet phase code on one local rank.

Each probe runs inside `measure_peak_rss`'s fresh process: it loads a saved model folder into the engine
the role would use, builds a batch of the planned size (every row at full length; one prompt one token
shorter, so there is padding and an attention mask, as in RL batches), and runs the phase. Probes that
measure a no-grad pass or generation first reach the steady state (one optimizer step, so AdamW states
exist). Every probe resets the peak after its setup (loading the model from safetensors briefly holds
the file's pages next to the parameters), so the peak is that of the phase; the model's resident memory
still counts, since it is above the baseline.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch, BatchMeta
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs, TrainingEngine
from quartet.planning.measure import reset_peak_rss

__all__ = [
    "engine_has_tensor_parallel",
    "moe_rank",
    "old_logprobs",
    "rollout_generate",
    "save_random_model",
    "update",
    "update_rank",
]


def save_random_model(folder: Path, config: dict[str, Any]) -> Path:
    """A randomly initialised Qwen2 causal LM of `config` (transformers kwargs) saved to `folder`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**config, eos_token_id=None, bos_token_id=None, pad_token_id=0))
    model.save_pretrained(folder)
    return folder


def save_random_moe(folder: Path, config: dict[str, Any]) -> Path:
    """A randomly initialised Qwen3-MoE causal LM of `config` (transformers kwargs) saved to `folder`."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = {**config, "eos_token_id": None, "bos_token_id": None, "pad_token_id": 0}
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**config)).save_pretrained(folder)
    return folder


def _one_rank() -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ[key] = "1" if key == "WORLD_SIZE" else "0"


def _settle() -> None:
    """End of setup: what loading the model left behind is garbage-collected and the peak restarts here."""
    gc.collect()
    reset_peak_rss()


def make_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> Batch:
    """Full-length rows, except one prompt shorter by a token (left padding gives the batch a mask)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, vocab, (rows, prompt_len), generator=g)
    responses = torch.randint(1, vocab, (rows, response_len), generator=g)
    mask = torch.ones(rows, prompt_len + response_len, dtype=torch.int64)
    if prompt_len > 1:
        mask[0, 0] = 0
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "attention_mask": mask,
        "response_mask": mask[:, prompt_len:].clone(),
        "advantages": torch.randn(rows, response_len, generator=g),
        "targets": torch.randn(rows, response_len, generator=g),
    }
    return Batch(tensors, meta=BatchMeta(temperature=1.0))


def _pg_loss(outputs: ModelOutputs, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, Mapping[str, float]]:
    assert outputs.logprobs is not None
    valid = mb["response_mask"] != 0
    return torch.where(valid, -mb["advantages"] * outputs.logprobs, 0.0).sum() / scale.tokens, {}


def _value_loss(
    outputs: ModelOutputs, mb: Batch, scale: LossScale
) -> tuple[torch.Tensor, Mapping[str, float]]:
    assert outputs.values is not None
    valid = mb["response_mask"] != 0
    return torch.where(valid, (outputs.values - mb["targets"]) ** 2, 0.0).sum() / scale.tokens, {}


def _engine(folder: str, kind: ModelKind, precision: str, checkpointing: bool) -> TrainingEngine:
    _one_rank()
    spec = EngineSpec(
        folder,
        kind,
        mixed_precision=Dtype(precision),
        optim=OptimConfig(lr=1e-4),
        gradient_checkpointing=checkpointing,
    )
    return TrainingEngine(spec)


def engine_has_tensor_parallel() -> bool:
    """Whether this tree's `EngineSpec` takes `tensor_parallel_size` (the TP engine is built separately)."""
    return "tensor_parallel_size" in {f.name for f in dataclasses.fields(EngineSpec)}


def update_rank(
    folder: str,
    rank: int,
    world: int,
    port: int,
    sp: int,
    tp: int,
    micro: int,
    prompt_len: int,
    response_len: int,
    vocab: int,
    fused: bool = False,
) -> int:
    """Rank `rank` of a `world`-rank gloo actor engine (packed rows; sequence parallel over `sp`, tensor
    parallel over `tp` ranks): two optimizer steps over this rank's `micro` rows, cut into micro-batches
    of `micro` rows of its group (the ranks of a sequence group pool their rows, so with sp = 2 each rank
    runs two micro-batches of half their tokens). `fused`: the fused LM head (`engines.fused_head`)."""
    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    parallel: dict[str, int] = {"sequence_parallel_size": sp}
    if tp > 1:
        parallel["tensor_parallel_size"] = tp
    spec = EngineSpec(
        folder,
        ModelKind.CAUSAL_LM,
        mixed_precision=Dtype.FLOAT32,
        optim=OptimConfig(lr=1e-4),
        remove_padding=True,
        fused_head=fused,
        **parallel,  # type: ignore[arg-type]
    )
    engine = TrainingEngine(spec)
    batch = make_batch(micro, prompt_len, response_len, vocab, seed=rank)
    _settle()
    try:
        for _ in range(2):
            engine.train_step(batch, _pg_loss, MicroSpec(size=micro))
        return engine.steps
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def moe_rank(
    folder: str,
    rank: int,
    world: int,
    port: int,
    ep: int,
    update_phase: bool,
    micro: int,
    prompt_len: int,
    response_len: int,
    vocab: int,
) -> int:
    """Rank `rank` of a `world`-rank gloo actor engine of an MoE folder with `model.expert_parallel_size`
    `ep` (packed rows, float32): with `update_phase`, two optimizer steps over this rank's `micro` rows; else
    one small step (AdamW states exist), then the old-log-prob pass (entropy on) over them. Returns the
    bytes of the routed experts' weights this rank holds (the local shards of `mlp.experts.*`)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    spec = EngineSpec(
        folder,
        ModelKind.CAUSAL_LM,
        mixed_precision=Dtype.FLOAT32,
        optim=OptimConfig(lr=1e-4),
        remove_padding=True,
        expert_parallel_size=ep,
    )
    engine = TrainingEngine(spec)
    batch = make_batch(micro, prompt_len, response_len, vocab, seed=rank)
    if not update_phase:
        engine.train_step(make_batch(1, 2, 1, vocab, seed=rank), _pg_loss, MicroSpec(size=1))
    _settle()
    try:
        if update_phase:
            for _ in range(2):
                engine.train_step(batch, _pg_loss, MicroSpec(size=micro))
        else:
            engine.forward_logprobs(batch, 1.0, MicroSpec(size=micro), with_entropy=True)
        experts = [p for n, p in engine.module.named_parameters() if ".mlp.experts." in n]
        local = [p.to_local() if isinstance(p, DTensor) else p for p in experts]
        return sum(t.numel() * t.element_size() for t in local)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def update(
    folder: str,
    value_model: bool,
    precision: str,
    checkpointing: bool,
    micro: int,
    prompt_len: int,
    response_len: int,
    vocab: int,
) -> int:
    """Two optimizer steps (the second in the steady state), each over two micro-batches of `micro` rows:
    the actor's (policy-gradient loss on the causal LM) or, with `value_model`, the critic's (value loss on
    the trunk with a fresh value head)."""
    kind, loss = (ModelKind.VALUE, _value_loss) if value_model else (ModelKind.CAUSAL_LM, _pg_loss)
    engine = _engine(folder, kind, precision, checkpointing)
    batch = make_batch(2 * micro, prompt_len, response_len, vocab)
    _settle()
    for _ in range(2):
        engine.train_step(batch, loss, MicroSpec(size=micro))
    return engine.steps


def old_logprobs(
    folder: str, precision: str, micro: int, prompt_len: int, response_len: int, vocab: int
) -> int:
    """The actor's old-log-prob pass (no grad, with entropy) after one small step (AdamW states exist)."""
    engine = _engine(folder, ModelKind.CAUSAL_LM, precision, False)
    engine.train_step(make_batch(1, 2, 1, vocab), _pg_loss, MicroSpec(size=1))
    batch = make_batch(micro, prompt_len, response_len, vocab)
    _settle()
    logprobs, _ = engine.forward_logprobs(batch, 1.0, MicroSpec(size=micro), with_entropy=True)
    return int(logprobs.shape[0])


def rollout_generate(
    folder: str, max_num_seqs: int, prompts: int, n: int, prompt_len: int, response_len: int, vocab: int
) -> int:
    """The built-in rollout engine generating n full-length responses to each prompt (EOS ignored)."""
    from quartet.config.rollout import RolloutConfig, RolloutEngineKind
    from quartet.rollout.factory import make_engine
    from quartet.rollout.types import GenerationRequest, SamplingParams

    rollout_cfg = RolloutConfig(n=n, max_num_seqs=max_num_seqs)
    engine = make_engine(
        RolloutEngineKind.TORCH,
        folder,
        rollout_cfg,
        max_model_len=prompt_len + response_len,
        dtype=torch.float32,
        seed=0,
    )
    _settle()
    g = torch.Generator().manual_seed(0)
    sampling = SamplingParams(n=n, max_new_tokens=response_len, seed=0, ignore_eos=True)
    requests = [
        GenerationRequest(tuple(torch.randint(1, vocab, (prompt_len,), generator=g).tolist()), sampling)
        for _ in range(prompts)
    ]
    try:
        outputs = engine.generate(requests)
    finally:
        engine.shutdown()
    return sum(len(o.token_ids) for group in outputs for o in group)
