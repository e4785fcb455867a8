"""Expert parallel 1 vs 2 on the same 2 ranks: step time, memory per rank, and whether both train to the
same parameters.

What runs: a tiny Qwen3-MoE (experts dominate its parameters) in the training engine on 2 gloo ranks
(`torch.multiprocessing.spawn`), once as FSDP2 over both ranks (ep1: every layer's experts are sharded and
all-gathered whole before the layer runs) and once as ep2 (each rank holds and computes half of every
layer's experts, tokens travel by all-to-all; no expert is ever gathered). The rows (random tokens, random
advantages, a policy-gradient token-mean loss) and the optimizer are the same, so the parameters after the
steps must agree up to float32 rounding.

Per rank: the median step time over the steps after the first (which allocates Adam's states), the resident
set before a step, the peak increase during it (`quartet.planning.measure`: VmHWM reset before the step;
`MALLOC_MMAP_THRESHOLD_` fixed at 64 KiB so that freed tensors go back to the OS), and the exact bytes of
this rank's parameter and Adam-state shards. The ratios ep2 / ep1 come from the same run.

    python benchmarks/expert_parallel.py                           # the committed table (benchmarks/results/)
    python benchmarks/expert_parallel.py --steps 2 --out /tmp/x    # a quick check
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_result  # noqa: E402

from quartet.config.model import TinyArch, TinyModelConfig  # noqa: E402
from quartet.core.batch import Batch, BatchMeta  # noqa: E402

WORLD = 2
TINY = TinyModelConfig(
    arch=TinyArch.QWEN3_MOE,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=16,
    num_experts_per_tok=2,
    moe_intermediate_size=256,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rows(count: int, prompt: int, response: int, seed: int = 0, vocab: int = 400) -> Batch:
    """`count` rows of random tokens below `vocab`, every position real, with random advantages."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(count, prompt + response, dtype=torch.int64)
    return Batch(
        {
            "prompts": torch.randint(10, vocab, (count, prompt), generator=g),
            "responses": torch.randint(10, vocab, (count, response), generator=g),
            "attention_mask": mask,
            "response_mask": mask[:, prompt:].clone(),
            "advantages": torch.randn(count, response, generator=g),
        },
        meta=BatchMeta(temperature=1.0),
    )


def pg_loss(out: Any, mb: Batch, scale: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """-advantage x log-prob, token-mean over the mini-batch's tokens."""
    valid = mb["response_mask"] != 0
    return torch.where(valid, -mb["advantages"] * out.logprobs, 0.0).sum() / scale.tokens, {}


def trim_heap() -> None:
    """Collect garbage and hand freed heap back to the OS, so a peak measured next starts from a floor."""
    gc.collect()
    with contextlib.suppress(OSError):  # not glibc: the peaks are then upper bounds
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _local_bytes(t: Any) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.numel() * local.element_size()) if isinstance(local, torch.Tensor) else 0


def run_rank(rank: int, ep: int, port: int, model_dir: str, batch: Batch, steps: int, out: str) -> None:
    """One rank: `steps` optimizer steps on its half of the rows; its timings and bytes (rank 0: params)."""
    from quartet.config.model import Dtype
    from quartet.config.optim import OptimConfig
    from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
    from quartet.engines.dist import to_local_full
    from quartet.engines.hf_modules import hf_model
    from quartet.planning.measure import current_rss_bytes, peak_rss_bytes, reset_peak_rss

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    optim = OptimConfig(lr=0.1, eps=1.0, weight_decay=0.0, grad_clip=0.0)  # steps proportional to grads
    spec = EngineSpec(
        model_dir,
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=optim,
        remove_padding=True,
        expert_parallel_size=ep,
    )
    engine = TrainingEngine(spec)
    share = len(batch) // WORLD
    mine = batch.slice(rank * share, (rank + 1) * share)
    record: dict[str, Any] = {"seconds": [], "increase_bytes": [], "before_bytes": [], "grad_norm": []}
    for _ in range(steps):
        trim_heap()
        before = current_rss_bytes()
        reset_peak_rss()
        start = time.perf_counter()
        metrics = engine.train_step(mine, pg_loss, MicroSpec(size=share))
        record["seconds"].append(time.perf_counter() - start)
        record["increase_bytes"].append(peak_rss_bytes() - before)
        record["before_bytes"].append(before)
        record["grad_norm"].append(metrics["grad_norm"])
    assert engine.optimizer is not None
    states = [v for s in engine.optimizer.state.values() for v in s.values()]
    record["param_bytes"] = sum(_local_bytes(p) for p in engine.module.parameters())
    record["adam_bytes"] = sum(_local_bytes(v) for v in states)
    params = {k: to_local_full(v).detach().clone() for k, v in hf_model(engine.module).state_dict().items()}
    if rank == 0:
        torch.save(params, Path(out) / "params.pt")
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _layout(ep: int, model_dir: str, batch: Batch, steps: int, folder: Path) -> dict[str, Any]:
    import torch.multiprocessing as mp

    folder.mkdir(parents=True, exist_ok=True)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)  # read by glibc when each rank starts
    args = (ep, _free_port(), model_dir, batch, steps, str(folder))
    mp.spawn(run_rank, args=args, nprocs=WORLD, join=True)  # type: ignore[attr-defined,no-untyped-call]
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {"ep": ep, "ranks": ranks, "params": torch.load(folder / "params.pt")}


def _summary(run: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    warm = slice(1, None)
    ranks = run["ranks"]
    seconds = statistics.median(max(t) for t in zip(*(r["seconds"][warm] for r in ranks), strict=True))
    return {
        "layout": f"ep{run['ep']}",
        "step_s": seconds,
        "peak_increase_mib_per_rank": max(statistics.median(r["increase_bytes"][warm]) for r in ranks)
        / 2**20,
        "rss_before_step_mib": max(r["before_bytes"][-1] for r in ranks) / 2**20,
        "param_mib_per_rank": max(r["param_bytes"] for r in ranks) / 2**20,
        "adam_mib_per_rank": max(r["adam_bytes"] for r in ranks) / 2**20,
        "max_param_diff_vs_ep1": max(
            float((run["params"][k] - v).abs().max()) for k, v in base["params"].items()
        ),
        "grad_norms": ranks[0]["grad_norm"],
    }


def main() -> None:
    from quartet.models.tiny import ensure_tiny_model

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=5, help="optimizer steps per layout (the first warms up)"
    )
    parser.add_argument("--rows", type=int, default=8, help="rows per step (global)")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--response-length", type=int, default=96)
    parser.add_argument("--out", type=Path, default=None, help="result folder (default benchmarks/results)")
    args = parser.parse_args()
    batch = rows(args.rows, args.prompt_length, args.response_length, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(ensure_tiny_model(TINY, Path(tmp) / "model"))
        runs = [_layout(ep, model_dir, batch, args.steps, Path(tmp) / f"ep{ep}") for ep in (1, 2)]
    summary = [_summary(run, runs[0]) for run in runs]
    keys = [
        "step_s",
        "peak_increase_mib_per_rank",
        "rss_before_step_mib",
        "param_mib_per_rank",
        "adam_mib_per_rank",
    ]
    ratios = {k: summary[1][k] / summary[0][k] for k in keys}
    settings = {
        "world": WORLD,
        "rows": args.rows,
        "tokens": int(batch["attention_mask"].sum()),
        "steps": args.steps,
        "tiny": {k: str(v) for k, v in dataclasses.asdict(TINY).items()},
        "dtype": "float32",
        "threads_per_rank": 1,
    }
    raw = [{k: v for k, v in run.items() if k != "params"} for run in runs]
    path = write_result(
        "expert_parallel", settings, raw, {"layouts": summary, "ep2_over_ep1": ratios}, out_dir=args.out
    )
    headers = ["layout", "step s", "step peak MiB/rank", "RSS before MiB", "params MiB/rank", "Adam MiB/rank"]
    table_rows = [[s["layout"], *(s[k] for k in keys)] for s in summary]
    table_rows.append(["ep2 / ep1", *(ratios[k] for k in keys)])
    print(f"{settings['tokens']} tokens in {args.rows} rows on {WORLD} ranks")
    print(table(headers, table_rows))
    print(f"max |param diff| ep2 vs ep1: {summary[1]['max_param_diff_vs_ep1']:.2e}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
