"""Does `torch.compile` speed up the built-in engine's decode step here? Eager vs compiled, side by side.

    .venv/bin/python benchmarks/decode_compile.py                       # tiny and demo sizes, 1 thread
    .venv/bin/python benchmarks/decode_compile.py --sizes tiny --threads 2 --steps 50

One decode step of `DecoderRunner` (the forward the engine runs per generated token: embeddings, rotary,
attention over the slot KV cache, MLP, head) for `--rows` sequences at a fixed cache width, the shape a
compiled engine would bucket to. Per size: the eager step, the first compiled call (the compile time a run
would pay per bucket shape) and the compiled step, alternated in rounds so load falls on both, and the
largest logit difference between them. The question it answers for issue 23 item 2: whether a compiled
decode step pays for its compile on this CPU (on a GPU, CUDA graphs remove the launch overhead instead).
Writes `benchmarks/results/decode_compile.json`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch
from common import table, write_result
from grpo_runs import SIZES

from quartet.config.model import TinyModelConfig
from quartet.models.tiny import save_tiny_model
from quartet.rollout.torch.model_runner import DecoderRunner


def step_ms(fn: Any, args: tuple[Any, ...], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        fn(*args)
    return (time.perf_counter() - start) / steps * 1e3


def measure(size: str, rows: int, width: int, steps: int, rounds: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    folder = tempfile.mkdtemp(prefix=f"decode-{size}-")
    save_tiny_model(folder, TinyModelConfig(**SIZES[size]))
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    runner = DecoderRunner(model)
    cache = runner.new_cache(rows)
    cache.ensure_capacity(width, 0)
    tokens = torch.randint(0, runner.vocab_size, (rows,))
    lengths = torch.full((rows,), width // 2)

    def step(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return runner.decode(tokens, lengths, width, cache)

    compiled = torch.compile(step, dynamic=False, fullgraph=True)
    with torch.no_grad():
        reference = step(tokens, lengths).clone()
        start = time.perf_counter()
        first = compiled(tokens, lengths)
        compile_s = time.perf_counter() - start
        max_diff = float((first - reference).abs().max())
        eager, fast = [], []
        for _ in range(rounds):
            eager.append(step_ms(step, (tokens, lengths), steps))
            fast.append(step_ms(compiled, (tokens, lengths), steps))
    eager_ms, compiled_ms = statistics.median(eager), statistics.median(fast)
    return {
        "size": size,
        "params": sum(p.numel() for p in model.parameters()),
        "eager_ms": eager_ms,
        "compiled_ms": compiled_ms,
        "speedup": eager_ms / compiled_ms,
        "compile_s": compile_s,
        "break_even_steps": compile_s * 1e3 / max(eager_ms - compiled_ms, 1e-9),
        "max_logit_diff": max_diff,
        "eager_rounds_ms": eager,
        "compiled_rounds_ms": fast,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="tiny,demo", help="comma-separated, of: " + ", ".join(SIZES))
    parser.add_argument("--rows", type=int, default=64, help="sequences decoded together")
    parser.add_argument("--width", type=int, default=64, help="cache positions attended (the bucket)")
    parser.add_argument("--steps", type=int, default=100, help="decode steps per timing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = [
        measure(size, args.rows, args.width, args.steps, args.rounds) for size in args.sizes.split(",")
    ]
    print(
        table(
            ["size", "eager ms", "compiled ms", "speedup", "compile s", "break-even steps", "max diff"],
            [
                [
                    r["size"],
                    f"{r['eager_ms']:.2f}",
                    f"{r['compiled_ms']:.2f}",
                    f"{r['speedup']:.2f}x",
                    f"{r['compile_s']:.1f}",
                    f"{r['break_even_steps']:.0f}",
                    f"{r['max_logit_diff']:.1e}",
                ]
                for r in results
            ],  # fmt: skip
        )
    )
    settings = {k: getattr(args, k) for k in ("sizes", "rows", "width", "steps", "rounds", "threads")}
    summary = {r["size"]: {k: r[k] for k in ("speedup", "compile_s", "break_even_steps")} for r in results}
    path = write_result("decode_compile", settings, results, summary, args.out_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
