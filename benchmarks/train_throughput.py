"""Training throughput of the `TrainingEngine` on ~20M and ~100M-parameter Qwen2s, fp32 versus bf16 autocast.

    .venv/bin/python benchmarks/train_throughput.py                    # 20M and 100M, fp32 and bf16
    .venv/bin/python benchmarks/train_throughput.py --sizes 20M --steps 5
    .venv/bin/python benchmarks/train_throughput.py --smoke            # a ~1M model, 1 round (< 60 s)

A randomly initialised Qwen2 (built from a config in-process, saved to a temporary folder, loaded back
through the engine like any checkpoint) is trained with a token-mean policy-gradient loss on random tokens.
Sizes (tied embeddings; `--batch`, `--micro`, `--prompt-len`, `--response-len`, `--steps` override):
  20M   hidden 512, 6 layers, vocab 8192:   8 rows x 64+192 tokens, micro-batch 4, 2 rounds
  100M  hidden 768, 12 layers, vocab 32000: 4 rows x 64+128 tokens, micro-batch 4, 2 rounds (smaller
        than 20M's batch so that the default run of both sizes stays under ~4 minutes on a 2-core CPU)
  1M    hidden 128, 4 layers, vocab 2048:   2 rows x 16+32 tokens, 1 round (the smoke run)
Both precisions are warmed up, then timed in interleaved rounds. Load from other processes only ever
adds time, so the derived figures use each precision's BEST round (the median is shown too):
  best s, med s   wall time of one `train_step` (forward + backward over micro-batches + AdamW step)
  train tok/s     prompt + response tokens trained per second
  GFLOP/s         6 x parameters x tokens / step time (forward 2N + backward 4N per token; attention
                  score FLOPs, about 12 x layers x hidden x seq per token, are left out: a few % here)
  MFU bf16, fp32  that figure as a fraction of the best 2048x2048 matmul speed in bf16, and in fp32,
                  measured before every round of the same run (`common.matmul_peak_gflops`, best of the
                  whole run: the practical peak of this machine's BLAS at torch's thread count)
  logprob tok/s   tokens per second of `forward_logprobs` (no gradient)
Writes `train_throughput.json` (see `common.py`) under `--out-dir` (default `benchmarks/results/`): `raw`
holds every round's train and log-prob seconds and every matmul peak measured, `summary` the figures above.
The machine may be shared: figures are indicative, compare rows of one run.

Default run 2026-11-24 (2 threads, load 1.7-2.6 from other jobs, 3 min 5 s; best rounds, medians up to 5x
slower under that load):
  size  precision  params M  best s  train tok/s  GFLOP/s  MFU bf16  MFU fp32  logprob tok/s
  20M   float32        21.9    6.16          332     43.7     0.272     0.139           1167
  20M   bfloat16       21.9    2.55          803      105     0.657     0.336           2840
  100M  float32         104    3.77          204      127     0.794     0.406           1072
  100M  bfloat16        104    5.57          138     86.3     0.537     0.275            552
  (matmul 2048^2 peak, best of the run: fp32 314, bf16 161 GFLOP/s)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from common import RESULTS_DIR, matmul_peak_gflops, table, write_result
from transformers import Qwen2Config, Qwen2ForCausalLM

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch, BatchMeta
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs, TrainingEngine


@dataclass(frozen=True)
class Size:
    """One model shape and the workload it is timed on."""

    hidden: int
    layers: int
    vocab: int
    batch: int
    micro: int
    prompt_len: int
    response_len: int
    steps: int

    @property
    def tokens(self) -> int:
        return self.batch * (self.prompt_len + self.response_len)


SIZES = {
    "1M": Size(hidden=128, layers=4, vocab=2048, batch=2, micro=2, prompt_len=16, response_len=32, steps=1),
    "20M": Size(hidden=512, layers=6, vocab=8192, batch=8, micro=4, prompt_len=64, response_len=192, steps=2),
    "100M": Size(
        hidden=768, layers=12, vocab=32000, batch=4, micro=4, prompt_len=64, response_len=128, steps=2
    ),
}
PRECISIONS = {Dtype.FLOAT32: "float32", Dtype.BFLOAT16: "bfloat16"}


def build_model(folder: Path, size: Size) -> int:
    """Save a random Qwen2 of this shape to `folder`; return its parameter count."""
    config = Qwen2Config(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.hidden * 11 // 4,
        num_hidden_layers=size.layers,
        num_attention_heads=size.hidden // 64,
        num_key_value_heads=max(1, size.hidden // 128),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def make_batch(size: Size) -> Batch:
    g = torch.Generator().manual_seed(0)
    rows, prompt_len, response_len = size.batch, size.prompt_len, size.response_len
    return Batch(
        {
            "prompts": torch.randint(0, size.vocab, (rows, prompt_len), generator=g),
            "responses": torch.randint(0, size.vocab, (rows, response_len), generator=g),
            "attention_mask": torch.ones(rows, prompt_len + response_len, dtype=torch.int64),
            "response_mask": torch.ones(rows, response_len, dtype=torch.int64),
            "advantages": torch.randn(rows, response_len, generator=g),
        },
        meta=BatchMeta(temperature=1.0),
    )


def pg_loss(outputs: ModelOutputs, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, Mapping[str, float]]:
    assert outputs.logprobs is not None
    valid = mb["response_mask"] != 0
    return torch.where(valid, -mb["advantages"] * outputs.logprobs, 0.0).sum() / scale.tokens, {}


def measure(folder: Path, size: Size, peak_n: int = 2048) -> dict[str, dict[str, list[float]]]:
    """Seconds per train step and per log-prob pass, and matmul GFLOP/s, for each precision, every round.

    Precisions take turns within each round, so load from other processes on a shared machine falls on
    both alike instead of on whichever runs second.
    """
    batch, micro = make_batch(size), MicroSpec(size=size.micro)
    engines = {
        p: TrainingEngine(EngineSpec(str(folder), ModelKind.CAUSAL_LM, p, optim=OptimConfig(lr=1e-5)))
        for p in PRECISIONS
    }
    for engine in engines.values():  # warmup: first-touch allocations, kernel selection
        engine.train_step(batch, pg_loss, micro)
        engine.forward_logprobs(batch, 1.0, micro)
    out = {name: {"train_s": [], "logprob_s": [], "peak_gflops": []} for name in PRECISIONS.values()}
    for _ in range(size.steps):
        for precision, engine in engines.items():
            r = out[PRECISIONS[precision]]
            r["peak_gflops"].append(matmul_peak_gflops(PRECISIONS[precision], n=peak_n, repeats=3))
            t = time.perf_counter()
            engine.train_step(batch, pg_loss, micro)
            r["train_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            engine.forward_logprobs(batch, 1.0, micro)
            r["logprob_s"].append(time.perf_counter() - t)
    return out


def summarize(raw: Mapping[str, Any], peaks: Mapping[str, float]) -> dict[str, Any]:
    """Per size and precision: best and median step, tok/s, GFLOP/s, MFU vs both peaks, logprob tok/s."""
    out: dict[str, Any] = {}
    for label, entry in raw.items():
        params, tokens = entry["params"], entry["tokens_per_step"]
        out[label] = {"params": params, "tokens_per_step": tokens}
        for name, r in entry["rounds"].items():
            step = min(r["train_s"])
            gflops = 6 * params * tokens / step / 1e9
            out[label][name] = {
                "best_step_s": step,
                "median_step_s": statistics.median(r["train_s"]),
                "train_tok_s": tokens / step,
                "gflops": gflops,
                "mfu_bf16": gflops / peaks["bfloat16"],
                "mfu_fp32": gflops / peaks["float32"],
                "logprob_tok_s": tokens / min(r["logprob_s"]),
            }
            own = out[label][name][
                f"mfu_{peak_key(name)}"
            ]  # a step can only be over its OWN precision's peak
            if own > 1:
                out[label].setdefault("suspect", []).append(
                    f"{name} at {own:.2f}x the {name} matmul peak: the peak was measured while other work "
                    "held the cores (rerun on a quiet machine)"
                )
    return out


def peak_key(dtype: str) -> str:
    """`bfloat16` -> `bf16`, `float32` -> `fp32` (the MFU keys' suffixes)."""
    return {"bfloat16": "bf16", "float32": "fp32"}[dtype]


def print_table(summary: Mapping[str, Any], peaks: Mapping[str, float]) -> None:
    fp32, bf16 = peaks["float32"], peaks["bfloat16"]
    print(f"\nmatmul peak (best of the run): fp32 {fp32:.0f}, bf16 {bf16:.0f} GFLOP/s")
    headers = ["size", "precision", "params M", "best s", "med s", "train tok/s", "GFLOP/s"]
    headers += ["MFU bf16", "MFU fp32", "logprob tok/s"]
    rows = [
        [label, name, s["params"] / 1e6, r["best_step_s"], r["median_step_s"], r["train_tok_s"], r["gflops"]]
        + [r["mfu_bf16"], r["mfu_fp32"], r["logprob_tok_s"]]
        for label, s in summary.items()
        for name, r in s.items()
        if isinstance(r, dict)
    ]
    print(table(headers, rows))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="20M,100M", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--smoke", action="store_true", help="the 1M model only, 1 round (< 60 s)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where the JSON result goes")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    for flag, help_ in [
        ("batch", "rows per train step"),
        ("micro", "rows per micro-batch"),
        ("prompt-len", "prompt tokens per row"),
        ("response-len", "response tokens per row"),
        ("steps", "timed rounds"),
    ]:
        parser.add_argument(f"--{flag}", type=int, default=None, help=f"{help_} (default: per size)")
    args = parser.parse_args()
    labels = ["1M"] if args.smoke else [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in labels if s not in SIZES]
    if unknown:
        parser.error(f"unknown sizes {unknown}; known: {list(SIZES)}")
    overrides = {
        k: v for k in ("batch", "micro", "prompt_len", "response_len", "steps") if (v := getattr(args, k))
    }
    args.plan = {label: replace(SIZES[label], **overrides) for label in labels}
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    raw: dict[str, Any] = {}
    # the smoke checks the pipeline, not the figures: a 256^2 peak, since a 2048^2 bf16 matmul takes ~1 min
    # on a CPU without native bf16 (AVX2: 0.3 GFLOP/s)
    peak_n = 256 if args.smoke else 2048
    for label, size in args.plan.items():
        with tempfile.TemporaryDirectory() as tmp:
            params = build_model(Path(tmp), size)
            print(
                f"{label}: Qwen2 {params / 1e6:.1f}M params (hidden {size.hidden}, {size.layers} layers, "
                f"vocab {size.vocab}); {size.batch} rows x {size.prompt_len}+{size.response_len} tokens = "
                f"{size.tokens} tokens/step, micro-batch {size.micro}, {size.steps} rounds"
            )
            t = time.perf_counter()
            rounds = measure(Path(tmp), size, peak_n)
            print(f"  measured in {time.perf_counter() - t:.0f} s")
        raw[label] = {
            "params": params,
            "tokens_per_step": size.tokens,
            "size": asdict(size),
            "rounds": rounds,
        }
    peaks = {
        name: max(p for entry in raw.values() for p in entry["rounds"][name]["peak_gflops"])
        for name in PRECISIONS.values()
    }
    summary = summarize(raw, peaks)
    print_table(summary, peaks)
    settings = {
        "sizes": {label: asdict(size) for label, size in args.plan.items()},
        "smoke": args.smoke,
        "threads": torch.get_num_threads(),
        "optimizer": "AdamW, lr 1e-5",
        "loss": "token-mean policy gradient on random tokens",
        "matmul_peak": f"{peak_n}^2, best of 3, before every round; best of the run",
    }
    path = write_result(
        "train_throughput", settings, raw, {"matmul_peak_gflops": peaks, "sizes": summary}, args.out_dir
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
