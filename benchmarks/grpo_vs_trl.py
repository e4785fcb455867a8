"""GRPO step time: quartet vs TRL's `GRPOTrainer`, same model, prompts and settings, runs alternated A/B.

    .venv/bin/python benchmarks/grpo_vs_trl.py                  # tiny and ~20M, 3 rounds (~6 min)
    .venv/bin/python benchmarks/grpo_vs_trl.py --sizes tiny --rounds 2 --smoke

Per size: the model is saved once (tokenizer trained here, random weights) and both sides load that folder;
the prompts are the built-in 2-digit addition task (the same parquet file). Each round runs TRL and
quartet once each, each in a fresh process, the order flipping every round (ABBA), so load from elsewhere
falls on both. A run's first step is warm-up (first-touch allocations, kernel selection) and is left out
of both sides' figures; the rest are pooled over rounds: median, min, max.

Matched settings (see `grpo_runs.GrpoSettings` and `peers/trl_grpo.py`): prompts per step, samples per
prompt, max new tokens (random weights rarely sample end-of-text, so both sides generate ~max tokens: the
mean response lengths are reported), temperature 1, no top-k/top-p, one optimizer step per step over the
whole batch in one micro-batch, one PPO epoch, token-mean loss, no KL, the same learning rate, fp32 both
sides (bf16 autocast is slower on this CPU for both: no AMX), the same number of torch threads.

The floor: the step's FLOPs at the matmul peak measured in this run at the same threads, in the faster of
the run's dtype and bf16 (on CPUs with AMX bf16 is several times faster; on this one fp32 is):
training 6 x N x tokens (forward 2N + backward 4N per token), plus 2 x N x tokens for each no-grad
log-prob pass quartet makes, plus generation 2 x N x (prompt + generated tokens) per sample. Generation of
64 rows at once reads each weight once per 64 rows (~32 FLOP per byte of fp32 weights), above this CPU's
compute/bandwidth ridge, so the compute bound is the bound. Attention-score FLOPs are left out (< 3% at
these lengths). N counts tied embeddings once (the LM head's matmul). The floor is therefore an
unattainable ideal: small matmuls, the sampler and Python run below the peak.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from common import matmul_peak_gflops, spread, table, write_result
from grpo_runs import SMOKE_OVERRIDES, GrpoSettings, RunResult, Workdir, prepare, run_quartet, run_trl

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from trl_env import TRL_VERSION, ensure_trl_venv  # noqa: E402

STEPS = {"tiny": 8, "20M": 4, "demo": 6}


def mean_prompt_tokens(w: Workdir, rows: int) -> float:
    """Mean chat-templated prompt length of the first `rows` prompts (what both sides feed the model)."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(w.model_dir)
    prompts = [r["prompt"] for r in pq.read_table(w.train_parquet).to_pylist()[:rows]]
    texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    lengths = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    return statistics.fmean(lengths)


def floor_seconds(
    params: int, rows: int, prompt: float, response: float, logprob_passes: int, gflops: float
) -> dict[str, float]:
    """The step's FLOPs split by phase, and their seconds at `gflops`."""
    tokens = rows * (prompt + response)
    flops = {
        "train": 6.0 * params * tokens,
        "logprob": 2.0 * params * tokens * logprob_passes,
        "gen": 2.0 * params * tokens,
    }
    return {f"{k}_s": v / (gflops * 1e9) for k, v in flops.items()} | {
        "total_s": sum(flops.values()) / (gflops * 1e9)
    }


def steady(runs: list[RunResult]) -> list[float]:
    """Step seconds of every run but its first (warm-up) step, pooled."""
    return [t for r in runs for t in r.step_seconds[1:]]


def run_size(size: str, args: argparse.Namespace, workdir: Path, trl_python: Path) -> dict[str, Any]:
    w = prepare(workdir, size)
    s = GrpoSettings(
        steps=args.steps or STEPS[size],
        prompts_per_step=args.prompts,
        n=args.n,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        threads=args.threads,
        lr=args.lr,
        quartet_overrides=tuple(args.quartet_override) + (SMOKE_OVERRIDES if args.smoke else ()),
    )
    torch.set_num_threads(args.threads)
    peak_n = (
        256 if args.smoke else 1024
    )  # the smoke checks the pipeline; a 1024^2 bf16 matmul is ~7 s on AVX2
    runs: dict[str, list[RunResult]] = {"trl": [], "quartet": []}
    peaks: list[float] = []
    for r in range(args.rounds):
        order = ["trl", "quartet"] if r % 2 == 0 else ["quartet", "trl"]
        peaks.append(matmul_peak_gflops(args.dtype, n=peak_n))
        for side in order:
            out = workdir / "runs" / f"{size}-{side}-{r}"
            name = f"{side}-{size}-r{r}"
            result = (
                run_quartet(w, s, out, name) if side == "quartet" else run_trl(trl_python, w, s, out, name)
            )
            runs[side].append(result)
            print(
                f"  {size} round {r} {side}: steps {[round(t, 3) for t in result.step_seconds]}", flush=True
            )
    peak = max(peaks)
    bf16_peak = matmul_peak_gflops("bfloat16", n=peak_n)
    q, t = steady(runs["quartet"]), steady(runs["trl"])
    phases: dict[str, float] = {}
    for name in runs["quartet"][0].phase_seconds:
        phases[name] = statistics.median(v for r in runs["quartet"] for v in r.phase_seconds[name][1:])
    rows = s.prompts_per_step * s.n
    prompt = mean_prompt_tokens(w, rows * s.steps)
    response = {k: statistics.fmean(x for r in v for x in r.response_length_mean) for k, v in runs.items()}
    passes = 1 if "old_log_prob" in phases else 0
    floor = floor_seconds(w.params, rows, prompt, response["quartet"], passes, max(peak, bf16_peak))
    # quartet runs each prompt once per group of n (`model.shared_prompts`, and its rollout's prefill): the
    # floor of that work, the same FLOPs with a row's prompt share divided by n
    floor_once = floor_seconds(
        w.params, rows, prompt / s.n, response["quartet"], passes, max(peak, bf16_peak)
    )
    summary = {
        "params": w.params,
        "quartet_step_s": spread(q),
        "trl_step_s": spread(t),
        "trl_over_quartet": statistics.median(t) / statistics.median(q),
        "quartet_phases_median_s": phases,
        "mean_prompt_tokens": prompt,
        "mean_response_tokens": response,
        "matmul_peak_gflops": {args.dtype: peak, "bfloat16": bf16_peak},
        "floor": floor,
        "floor_peak": "bfloat16" if bf16_peak > peak else args.dtype,
        "quartet_over_floor": statistics.median(q) / floor["total_s"],
        "floor_prompts_once": floor_once,
        "quartet_over_floor_prompts_once": statistics.median(q) / floor_once["total_s"],
        "trl_over_floor": statistics.median(t) / floor["total_s"],
        "process_s": {k: spread([r.process_seconds for r in v]) for k, v in runs.items()},
    }
    raw = {k: [vars(r) for r in v] for k, v in runs.items()} | {"matmul_peaks_gflops": peaks}
    return {"settings": vars(s) | {"size": size, "rounds": args.rounds}, "summary": summary, "raw": raw}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="tiny,20M", help="comma-separated, of: tiny, 20M, demo")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="steps per run (0: tiny 8, 20M 4)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--quartet-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for quartet's runs only (repeatable), e.g. actor.reuse_update_logprobs=false",
    )
    parser.add_argument(
        "--name", default="grpo_vs_trl", help="the result file's name (benchmarks/results/NAME.json)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny only, 2 rounds of 3 steps, small batch")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="models, data and runs (default: temporary)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.rounds, args.steps, args.prompts, args.n, args.max_new_tokens = "tiny", 2, 3, 4, 2, 8
    trl_python = ensure_trl_venv()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        results = {size: run_size(size, args, workdir, trl_python) for size in args.sizes.split(",")}
    rows = []
    for size, r in results.items():
        sm = r["summary"]
        rows.append([
            size, sm["params"] / 1e6, sm["trl_step_s"]["median"], sm["quartet_step_s"]["median"],
            f'{sm["quartet_step_s"]["min"]:.3g}-{sm["quartet_step_s"]["max"]:.3g}', sm["trl_over_quartet"],
            sm["floor"]["total_s"], sm["quartet_over_floor"], sm["trl_over_floor"],
        ])  # fmt: skip
    print(table(["size", "M params", "TRL s", "quartet s", "quartet min-max", "TRL/quartet", "floor s",
                 "quartet/floor", "TRL/floor"], rows))  # fmt: skip
    for size, r in results.items():
        phases = r["summary"]["quartet_phases_median_s"]
        print(f"quartet {size} phases (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
    path = write_result(
        args.name,
        {size: r["settings"] for size, r in results.items()} | {"smoke": args.smoke},  # overrides inside
        {size: r["raw"] for size, r in results.items()},
        {size: r["summary"] for size, r in results.items()},
        args.out_dir,
        {"trl": TRL_VERSION},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
