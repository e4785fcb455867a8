"""Training throughput of the `TrainingEngine` on a ~20M-parameter Qwen2, fp32 versus bf16 autocast.

    .venv/bin/python benchmarks/train_throughput.py [--steps 3] [--batch 8] [--response-len 192]

A randomly initialised Qwen2 (built from a config in-process, saved to a temporary folder, loaded back
through the engine like any checkpoint) is trained with a token-mean policy-gradient loss on random tokens.
Both precisions are warmed up, then timed in `--steps` interleaved rounds. Load from other processes
only ever adds time, so the derived figures use each precision's BEST round (the median is shown too):
  best s, med s   wall time of one `train_step` (forward + backward over micro-batches + AdamW step)
  train tok/s     prompt + response tokens trained per second
  GFLOP/s         6 x parameters x tokens / step time (forward 2N + backward 4N per token; attention
                  score FLOPs, about 12 x layers x hidden x seq per token, are left out: a few % here)
  % bf16, % fp32  that figure as a fraction of the best 2048x2048 matmul speed in bf16, and in fp32,
                  measured in each round of the same run (the practical peak of this machine's BLAS)
  logprob tok/s   tokens per second of `forward_logprobs` (no gradient)
The machine may be shared: figures are indicative, compare rows of one run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch, BatchMeta
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs, TrainingEngine


def build_model(folder: Path, hidden: int, layers: int, vocab: int) -> int:
    """Save a random Qwen2 of this shape to `folder`; return its parameter count."""
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def matmul_gflops(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """Best-of-`repeats` speed of an n x n matmul in `dtype`, GFLOP/s."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # warm up the kernel
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def make_batch(rows: int, prompt_len: int, response_len: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch(
        {
            "prompts": torch.randint(0, vocab, (rows, prompt_len), generator=g),
            "responses": torch.randint(0, vocab, (rows, response_len), generator=g),
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


PRECISIONS = {Dtype.FLOAT32: torch.float32, Dtype.BFLOAT16: torch.bfloat16}


def measure(folder: Path, batch: Batch, micro: MicroSpec, steps: int) -> dict[Dtype, dict[str, list[float]]]:
    """Seconds per train step and per log-prob pass, and matmul GFLOP/s, for each precision.

    Precisions take turns within each round, so load from other processes on a shared machine falls on
    both alike instead of on whichever runs second.
    """
    engines = {
        p: TrainingEngine(EngineSpec(str(folder), ModelKind.CAUSAL_LM, p, optim=OptimConfig(lr=1e-5)))
        for p in PRECISIONS
    }
    for engine in engines.values():  # warmup: first-touch allocations, kernel selection
        engine.train_step(batch, pg_loss, micro)
        engine.forward_logprobs(batch, 1.0, micro)
    out: dict[Dtype, dict[str, list[float]]] = {
        p: {"train": [], "logprob": [], "peak": []} for p in PRECISIONS
    }
    for _ in range(steps):
        for precision, engine in engines.items():
            out[precision]["peak"].append(matmul_gflops(PRECISIONS[precision], repeats=3))
            t = time.perf_counter()
            engine.train_step(batch, pg_loss, micro)
            out[precision]["train"].append(time.perf_counter() - t)
            t = time.perf_counter()
            engine.forward_logprobs(batch, 1.0, micro)
            out[precision]["logprob"].append(time.perf_counter() - t)
    return out


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8, help="rows per train step")
    parser.add_argument("--micro", type=int, default=4, help="rows per micro-batch")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=192)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    batch = make_batch(args.batch, args.prompt_len, args.response_len, args.vocab)
    tokens = args.batch * (args.prompt_len + args.response_len)
    micro = MicroSpec(size=args.micro)
    with tempfile.TemporaryDirectory() as tmp:
        params = build_model(Path(tmp), args.hidden, args.layers, args.vocab)
        print(
            f"Qwen2 {params / 1e6:.1f}M params "
            f"(hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}); "
            f"{args.batch} rows x {args.prompt_len}+{args.response_len} tokens = {tokens} tokens/step, "
            f"micro-batch {args.micro} rows; {torch.get_num_threads()} threads"
        )
        results = measure(Path(tmp), batch, micro, args.steps)
        peak = {p: max(r["peak"]) for p, r in results.items()}
        print(
            f"matmul 2048^2 peak (best of the run): fp32 {peak[Dtype.FLOAT32]:.0f} GFLOP/s, "
            f"bf16 {peak[Dtype.BFLOAT16]:.0f} GFLOP/s"
        )
        header = (
            f"{'precision':<10}{'best s':>8}{'med s':>8}{'train tok/s':>13}{'GFLOP/s':>9}"
            f"{'% bf16':>8}{'% fp32':>8}{'logprob tok/s':>15}"
        )
        print(header)
        print("-" * len(header))
        for precision, r in results.items():
            step, median, fwd = min(r["train"]), statistics.median(r["train"]), min(r["logprob"])
            gflops = 6 * params * tokens / step / 1e9
            print(
                f"{precision.value:<10}{step:>8.2f}{median:>8.2f}{tokens / step:>13.0f}"
                f"{gflops:>9.1f}{100 * gflops / peak[Dtype.BFLOAT16]:>7.0f}%"
                f"{100 * gflops / peak[Dtype.FLOAT32]:>7.0f}%{tokens / fwd:>15.0f}"
            )


if __name__ == "__main__":
    main()
