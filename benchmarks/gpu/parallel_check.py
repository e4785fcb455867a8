"""The GPU kit's sequence/tensor-parallel check that fits ONE device (`kit.py --only sp_tp_one_device`).

Exactness of SP and TP at 2+ ranks is proven on CPU with gloo (tests/engines/test_ulysses_dist.py,
test_tensor_parallel_dist.py). On one GPU, NCCL refuses two ranks on the same device, so what can run here is
the device side of the same code:

- `vocab_parallel`: the vocabulary-parallel log-probs and entropy (`engines.vocab_parallel`) on shards of
  a real-size [tokens, 151,936] logits tensor on the device, the group's reductions done over the stacked
  shards, against `engines.heads` on the full logits: values and the gradient. Then the same functions
  through a real one-rank process group (NCCL on CUDA), the collective path the engine takes.
- `tp_mesh`: the model split by the TP plans (`engines.tensor_parallel.parallelize`) on a one-device "tp" mesh
  (DTensors on the device) against the plain model: the same logits.
- `ulysses_attention`: the attention function of SP with a one-rank sequence group on the device, against
  per-row causal attention.

What needs more GPUs (reported in the result): sp >= 2 and tp >= 2 with NCCL, their all-to-alls and
reductions.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from typing import Any

import torch
import torch.distributed as dist
from checks import Context, Result

NEEDS_MORE_GPUS = "sp >= 2 and tp >= 2 over NCCL (two ranks on one GPU are refused by NCCL): run on 2+ GPUs"


class _StackedShards:
    """The reductions of a tensor group whose shards are stacked in dim 0 (every shard sees the result)."""

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t.sum(dim=0, keepdim=True).expand_as(t)

    def max(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().amax(dim=0, keepdim=True).expand_as(t)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_rank_group(ctx: Context) -> None:
    """A world-1 default process group (NCCL on CUDA, gloo on CPU) unless one exists."""
    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group(
        "nccl" if ctx.cuda else "gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120)
    )


def _vocab_parallel(ctx: Context, size: int = 4) -> Result:
    from quartet.engines import heads
    from quartet.engines.vocab_parallel import (
        GroupReduce,
        vocab_parallel_entropy,
        vocab_parallel_logprobs,
        vocab_slice,
    )

    tokens, vocab = (64, 512) if ctx.dry_run else (2048, 151_936)
    g = torch.Generator(device=ctx.device).manual_seed(0)
    logits = (4 * torch.randn(1, tokens, vocab, device=ctx.device, generator=g)).requires_grad_()
    targets = torch.randint(0, vocab, (1, tokens), device=ctx.device, generator=g)
    want_lp = heads.response_logprobs(logits, targets, 0.8)
    want_ent = heads.response_entropy(logits, 0.8)
    (want_grad,) = torch.autograd.grad((want_lp + 0.1 * want_ent).sum(), logits)
    width = -(-vocab // size)
    parts, starts = [], []
    for rank in range(size):
        start, end = vocab_slice(vocab, size, rank)
        pad = torch.full((1, tokens, width - (end - start)), float("-inf"), device=ctx.device)
        parts.append(torch.cat([logits[..., start:end], pad], dim=-1))
        starts.append(start)
    stacked = torch.stack(parts)
    first = torch.tensor(starts, device=ctx.device).view(size, 1, 1)
    lp = vocab_parallel_logprobs(stacked, targets, 0.8, first, _StackedShards())
    ent = vocab_parallel_entropy(stacked, 0.8, _StackedShards())
    (grad,) = torch.autograd.grad((lp[0] + 0.1 * ent[0]).sum(), logits)
    lp, ent, want_lp, want_ent = (t.detach() for t in (lp, ent, want_lp, want_ent))
    _one_rank_group(ctx)
    one = GroupReduce(None)  # the default group: this one rank
    lp1 = vocab_parallel_logprobs(logits.detach(), targets, 0.8, 0, one)
    return {
        "tokens": tokens,
        "vocab": vocab,
        "shards": size,
        "logprob_max_diff": float((lp - want_lp.unsqueeze(0)).abs().max()),
        "entropy_max_diff": float((ent - want_ent.unsqueeze(0)).abs().max()),
        "grad_max_diff": float((grad - want_grad).abs().max()),
        "one_rank_group_logprob_max_diff": float((lp1 - want_lp).abs().max()),
    }


def _tp_mesh(ctx: Context) -> Result:
    from torch.distributed.device_mesh import init_device_mesh

    from quartet.engines.tensor_parallel import parallelize
    from quartet.models.loading import load_causal_lm

    assert ctx.model_dir is not None, "build_model runs first"
    _one_rank_group(ctx)
    plain = load_causal_lm(ctx.model_dir).to(ctx.device).eval()
    split = load_causal_lm(ctx.model_dir).to(ctx.device).eval()
    parallelize(split, init_device_mesh(ctx.device.split(":")[0], (1,), mesh_dim_names=("tp",)))
    ids = torch.randint(0, int(plain.config.vocab_size), (2, 64), device=ctx.device)
    with torch.no_grad():
        want = plain(input_ids=ids).logits.float()
        got = split(input_ids=ids).logits
        got = (got.full_tensor() if hasattr(got, "full_tensor") else got).float()
    return {"logits_max_diff": float((got - want).abs().max()), "logits_scale": float(want.abs().max())}


def _ulysses(ctx: Context) -> Result:
    from quartet.engines.ulysses import SeqGroup, ulysses_attention

    heads, kv, dim, lengths = 8, 2, 64, (5, 17, 42) if ctx.dry_run else (700, 1500, 1900)
    bounds = tuple(int(sum(lengths[:i])) for i in range(len(lengths) + 1))
    n = bounds[-1]
    g = torch.Generator(device=ctx.device).manual_seed(1)
    q = torch.randn(1, heads, n, dim, device=ctx.device, generator=g)
    k = torch.randn(1, kv, n, dim, device=ctx.device, generator=g)
    v = torch.randn(1, kv, n, dim, device=ctx.device, generator=g)
    out, _ = ulysses_attention(torch.nn.Module(), q, k, v, None, dim**-0.5, 0.0, bounds, SeqGroup(1, 0))
    worst = 0.0
    for a, z in zip(bounds, bounds[1:], strict=False):
        rk, rv = (t[:, :, a:z].repeat_interleave(heads // kv, dim=1) for t in (k, v))
        want = torch.nn.functional.scaled_dot_product_attention(q[:, :, a:z], rk, rv, is_causal=True)
        worst = max(worst, float((out[0, a:z] - want[0].transpose(0, 1)).abs().max()))
    return {"tokens": n, "rows": len(lengths), "max_diff": worst}


def sp_tp_one_device(ctx: Context) -> Result:
    """The device side of SP and TP on one device (see the module doc); tolerances are float32's."""
    start = time.perf_counter()
    parts: dict[str, Any] = {
        "vocab_parallel": _vocab_parallel(ctx),
        "tp_mesh": _tp_mesh(ctx),
        "ulysses_attention": _ulysses(ctx),
    }
    vocab = parts["vocab_parallel"]
    bad = [
        name
        for name, worst in (
            ("vocab_parallel", max(vocab[k] for k in vocab if "diff" in k)),
            ("tp_mesh", parts["tp_mesh"]["logits_max_diff"]),
            ("ulysses_attention", parts["ulysses_attention"]["max_diff"]),
        )
        if not worst <= 2e-3
    ]
    result: Result = {
        "status": "fail" if bad else "pass",
        **parts,
        "needs_more_gpus": NEEDS_MORE_GPUS,
        "seconds": round(time.perf_counter() - start, 2),
    }
    if bad:
        result["reason"] = f"outside 2e-3 of the reference: {', '.join(bad)}"
    return result
