"""Long rows at sequence parallel 1, 2 and 4 on the same 4 ranks: activation memory per rank, step time, and
whether the three layouts train to the same parameters.

What runs: the tiny model of `examples/long_context/config.yaml` (its `model.tiny` shape) in the training
engine on 4 gloo ranks (`torch.multiprocessing.spawn`), as dp4 x sp1, dp2 x sp2 and dp1 x sp4. The world
size is the same in all three, so the rows, the FSDP2 sharding and the optimizer are the same, and only the
sequence split differs: the result must be equal up to float32 rounding.

The rows are produced once, in this process, from the built-in counting task (`quartet.tasks.counting`):
2 prompts x 4 responses, each response the correct run of integers with a slip at 100%, 75%, 50% or 25% of
its length (tokenized with the tiny tokenizer and cut at the example's `data.max_response_length`), scored
with the task's partial-credit reward and turned into GRPO advantages (`core.advantages.compute_grpo`).
Each step is the actor's policy-gradient update on them (`core.policy_loss.compute_policy_loss`, PPO clip,
token-mean), in micro-batches of 2 rows of the sequence group (each rank holds 1/sp of their tokens).

Memory per rank, on CPU: each rank is its own process; before a step it collects garbage and returns freed
heap to the OS, reads its resident set, resets its peak (`quartet.planning.measure`: `VmHWM` after writing
5 to /proc/self/clear_refs), runs the step and reads the peak. The increase is what the step allocated:
activations, plus the (sharded, tiny) gradients. `MALLOC_MMAP_THRESHOLD_` is fixed at 64 KiB in the ranks
so that glibc gives large tensors back when they are freed (its adaptive threshold would otherwise keep
them in the heap, and a step's peak would hide under the previous step's). Step 1 also allocates Adam's
states, so the figures are the median over the later steps.

    python benchmarks/long_context.py                     # the committed table (benchmarks/results/)
    python benchmarks/long_context.py --response-length 256 --steps 2 --out /tmp/x   # a quick check
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

from quartet.config import load_config  # noqa: E402
from quartet.core.batch import Batch, BatchMeta  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "long_context" / "config.yaml"
WORLD = 4
ROWS = 8
GROUP = 4
SLIPS = (1.0, 0.75, 0.5, 0.25)
"""Where each response of a group slips, as a share of its run (1.0: no slip)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _slipped(reply: str, share: float) -> str:
    """The run with the integer at `share` of its length replaced by 0 (unchanged for share 1.0)."""
    numbers = reply.split(" ")
    at = int(len(numbers) * share)
    if at < len(numbers):
        numbers[at] = "0"
    return " ".join(numbers)


def long_rows(tokenizer: Any, response_length: int, seed: int) -> Batch:
    """8 rows of the counting task (2 prompts x 4 responses), left-padded prompts, right-padded responses,
    with GRPO advantages from the task's reward."""
    import random

    from quartet.core.advantages import compute_grpo
    from quartet.tasks.counting import CountingSpec, compute_score

    rng = random.Random(seed)
    prompts, responses, scores = [], [], []
    for _ in range(ROWS // GROUP):
        problem = CountingSpec().draw(rng)
        chat = [{"role": "user", "content": problem.question}]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        for share in SLIPS:
            slipped = tokenizer.encode(_slipped(problem.reply, share), add_special_tokens=False)
            reply = (slipped + [tokenizer.eos_token_id])[:response_length]
            prompts.append(list(ids))
            responses.append(reply)
            scores.append(compute_score(tokenizer.decode(reply, skip_special_tokens=True), problem.answer))
    p_len = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    prompt_t = torch.tensor([[pad] * (p_len - len(p)) + p for p in prompts])
    response_t = torch.tensor([r + [pad] * (response_length - len(r)) for r in responses])
    prompt_mask = (torch.arange(p_len) >= p_len - torch.tensor([len(p) for p in prompts])[:, None]).long()
    response_mask = (
        torch.arange(response_length) < torch.tensor([len(r) for r in responses])[:, None]
    ).long()
    rewards = torch.zeros(ROWS, response_length)
    rewards[torch.arange(ROWS), response_mask.sum(1) - 1] = torch.tensor(scores)
    uids = [f"p{i // GROUP}" for i in range(ROWS)]
    advantages = compute_grpo(rewards, response_mask, uids).advantages
    return Batch(
        {
            "prompts": prompt_t,
            "responses": response_t,
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "response_mask": response_mask,
            "advantages": advantages,
        },
        {"uid": uids},
        meta=BatchMeta(temperature=1.0),
    )


def grpo_loss(out: Any, mb: Batch, scale: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor's PPO-clip policy loss, token-mean over the mini-batch's tokens (on-policy: ratio 1)."""
    from quartet.core.policy_loss import compute_policy_loss

    assert out.logprobs is not None
    pg = compute_policy_loss(
        "ppo",
        out.logprobs,
        out.logprobs.detach(),
        mb["advantages"],
        mb["response_mask"],
        global_token_count=scale.tokens,
        global_seq_count=scale.sequences,
    )
    return pg.loss, {}


def _trim_heap() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc), so the next peak starts clean."""
    gc.collect()
    with contextlib.suppress(OSError):  # not glibc: the peaks are then upper bounds
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def run_rank(rank: int, sp: int, port: int, model_dir: str, batch: Batch, steps: int, out: str) -> None:
    """One rank: `steps` optimizer steps on its 2 rows; its timings and peaks (and rank 0 the parameters)."""
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
    # eps >> |grad|: each Adam step is proportional to the gradient. With the default eps a step is about
    # lr * sign(g), which turns float32 rounding in gradients near 0 into differences of up to lr.
    optim = OptimConfig(lr=0.1, eps=1.0, weight_decay=0.0, grad_clip=0.0)
    spec = EngineSpec(
        model_dir,
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=optim,
        remove_padding=True,
        sequence_parallel_size=sp,
    )
    engine = TrainingEngine(spec)
    initial = {k: to_local_full(v).detach().clone() for k, v in hf_model(engine.module).state_dict().items()}
    share = ROWS // WORLD
    mine = batch.slice(rank * share, (rank + 1) * share)
    record: dict[str, list[float]] = {
        "seconds": [],
        "increase_bytes": [],
        "before_bytes": [],
        "grad_norm": [],
    }
    for _ in range(steps):
        _trim_heap()
        before = current_rss_bytes()
        reset_peak_rss()
        start = time.perf_counter()
        metrics = engine.train_step(mine, grpo_loss, MicroSpec(size=2))
        record["seconds"].append(time.perf_counter() - start)
        record["increase_bytes"].append(peak_rss_bytes() - before)
        record["before_bytes"].append(before)
        record["grad_norm"].append(metrics["grad_norm"])
    params = {k: to_local_full(v).detach().clone() for k, v in hf_model(engine.module).state_dict().items()}
    if rank == 0:
        torch.save(params, Path(out) / "params.pt")
        record["max_param_change"] = [max(float((params[k] - v).abs().max()) for k, v in initial.items())]
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _layout(sp: int, model_dir: str, batch: Batch, steps: int, folder: Path) -> dict[str, Any]:
    """Run the 4 ranks at sequence parallel `sp`; their records and rank 0's final parameters."""
    import torch.multiprocessing as mp

    folder.mkdir(parents=True, exist_ok=True)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)  # read by glibc when each rank starts
    args = (sp, _free_port(), model_dir, batch, steps, str(folder))
    mp.spawn(run_rank, args=args, nprocs=WORLD, join=True)  # type: ignore[attr-defined,no-untyped-call]
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {"sp": sp, "dp": WORLD // sp, "ranks": ranks, "params": torch.load(folder / "params.pt")}


def _summary(run: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Per layout: the largest rank's median step-2+ increase, the slowest rank's median step time, and the
    largest parameter difference from sp 1."""
    warm = slice(1, None)
    increase = max(statistics.median(r["increase_bytes"][warm]) for r in run["ranks"])
    seconds = statistics.median(max(t) for t in zip(*(r["seconds"][warm] for r in run["ranks"]), strict=True))
    diff = max(float((run["params"][k] - v).abs().max()) for k, v in base["params"].items())
    return {
        "layout": f"dp{run['dp']} x sp{run['sp']}",
        "activation_mib_per_rank": increase / 2**20,
        "rss_before_step_mib": max(r["before_bytes"][-1] for r in run["ranks"]) / 2**20,
        "step_s": seconds,
        "max_param_diff_vs_sp1": diff,
        "max_param_change": run["ranks"][0]["max_param_change"][0],
        "grad_norms": run["ranks"][0]["grad_norm"],
    }


def main() -> None:
    from transformers import AutoTokenizer

    from quartet.models.tiny import ensure_tiny_model

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cfg = load_config(str(EXAMPLE))
    parser.add_argument("--response-length", type=int, default=cfg.data.max_response_length)
    parser.add_argument(
        "--steps", type=int, default=4, help="optimizer steps per layout (the first warms up)"
    )
    parser.add_argument("--sp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="result folder (default benchmarks/results)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(ensure_tiny_model(cfg.model.tiny, Path(tmp) / "model"))
        batch = long_rows(AutoTokenizer.from_pretrained(model_dir), args.response_length, args.seed)
        runs = [_layout(sp, model_dir, batch, args.steps, Path(tmp) / f"sp{sp}") for sp in args.sp]
    summary = [_summary(run, runs[0]) for run in runs]
    tokens = int(batch["attention_mask"].sum())
    settings = {
        "world": WORLD,
        "rows": ROWS,
        "tokens": tokens,
        "response_length": args.response_length,
        "steps": args.steps,
        "tiny": dataclasses.asdict(cfg.model.tiny),
        "micro_batch_rows_per_group": 2,
        "dtype": "float32",
    }
    raw = [{k: v for k, v in run.items() if k != "params"} for run in runs]
    path = write_result("long_context", settings, raw, {"layouts": summary}, out_dir=args.out)
    headers = ["layout", "activation MiB/rank", "RSS before step MiB", "step s", "max |param diff| vs sp1"]
    keys = ["layout", "activation_mib_per_rank", "rss_before_step_mib", "step_s", "max_param_diff_vs_sp1"]
    print(f"{tokens} tokens in {ROWS} rows on {WORLD} ranks")
    print(table(headers, [[s[k] for k in keys] for s in summary]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
