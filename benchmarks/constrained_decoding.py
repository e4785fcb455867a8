"""What does constrained decoding (`SamplingParams.grammar`) cost the built-in engine per step?

    .venv/bin/python benchmarks/constrained_decoding.py                 # 4 requests x 2 samples, 64 tokens
    .venv/bin/python benchmarks/constrained_decoding.py --smoke         # tiny settings, for CI

The same batch of `--requests` requests (`--n` samples each, `--tokens` tokens, `ignore_eos`) is generated
with none, one, or all of its requests under a grammar that allows any `--tokens`-token answer of letters
and spaces (so every sequence runs the full length and the work is the same), in alternated rounds so load
falls on all three. Reported: milliseconds per engine step (wall time / steps), per case. The question it
answers: what one constrained row adds to a step (the CPU mask computation, its unpacking, the parser
advancing), and that a batch with no grammar pays nothing (compare with the unconstrained column of
another run: the code path is one `any()` per step). Writes `benchmarks/results/constrained_decoding.json`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch
from common import spread, table, write_result

from quartet.config.model import TinyModelConfig
from quartet.models.loading import load_causal_lm, load_tokenizer
from quartet.models.tiny import save_tiny_model
from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine

PROMPTS = ["What is 12 + 7?", "hello", "thanks: 5 - 2", "please solve 3 * 4"]


def _requests(tok: Any, args: argparse.Namespace, constrained: int, grammar: str) -> list[GenerationRequest]:
    prompts = [tuple(tok(PROMPTS[i % len(PROMPTS)])["input_ids"]) for i in range(args.requests)]
    return [
        GenerationRequest(
            p,
            SamplingParams(
                temperature=1.0,
                n=args.n,
                seed=i,
                max_new_tokens=args.tokens,
                ignore_eos=True,
                grammar=grammar if i < constrained else None,
            ),
        )
        for i, p in enumerate(prompts)
    ]


def step_ms(engine: TorchRolloutEngine, requests: list[GenerationRequest], tokens: int) -> float:
    steps = engine.core.steps
    start = time.perf_counter()
    outs = engine.generate(requests)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == tokens for group in outs for o in group)  # the same work in every case
    return elapsed / (engine.core.steps - steps) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--n", type=int, default=2, help="samples per request")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="tiny settings (CI)")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.requests, args.n, args.tokens, args.rounds = 2, 1, 8, 1
    from llguidance import LLMatcher

    folder = tempfile.mkdtemp(prefix="constrained-")
    save_tiny_model(folder, TinyModelConfig())
    tok = load_tokenizer(folder)
    grammar = LLMatcher.grammar_from_regex(f"[a-z ]{{{args.tokens * 16}}}")  # never complete within the limit
    cases = {"none": 0, "one": 1, "all": args.requests}
    raw: dict[str, list[float]] = {name: [] for name in cases}
    with TorchRolloutEngine(load_causal_lm(folder), tok, max_num_seqs=64, num_threads=args.threads) as engine:
        for constrained in cases.values():  # warm-up: the token trie, the first compile, allocations
            step_ms(engine, _requests(tok, args, constrained, grammar), args.tokens)
        for _ in range(args.rounds):
            for name, constrained in cases.items():
                raw[name].append(step_ms(engine, _requests(tok, args, constrained, grammar), args.tokens))
    summary = {f"{name}_ms_per_step": statistics.median(values) for name, values in raw.items()}
    rows = [
        [name, f"{cases[name]}/{args.requests}", f"{summary[f'{name}_ms_per_step']:.2f}"] for name in cases
    ]
    print(table(["case", "constrained requests", "ms per engine step"], rows))
    settings = {k: getattr(args, k) for k in ("requests", "n", "tokens", "rounds", "threads", "smoke")}
    settings["torch_threads"] = torch.get_num_threads()
    path = write_result(
        "constrained_decoding",
        settings,
        {k: spread(v) | {"values": v} for k, v in raw.items()},
        summary,
        args.out_dir,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
