"""What does the Tinker API add to a sample call? The SDK through the service vs `sample` called directly.

    .venv/bin/python benchmarks/tinker_sample_overhead.py               # 4 samples x 32 tokens, 20 rounds
    .venv/bin/python benchmarks/tinker_sample_overhead.py --smoke       # tiny settings, for CI

The same request, `--samples` samples of `--tokens` tokens (stops off, so every sample runs the full
length; a fixed seed, so both sides decode the same tokens) from a `--prompt`-token prompt of the tiny
model, timed two ways in alternated rounds so load falls on both: (A) `SamplingClient.sample(...).result()`
through a `TinkerServer` in this process (HTTP, JSON body, the future and its polls, protobuf answer), and
(B) `quartet.serving.tinker.sampling.sample` on a module loaded the same way. Also `compute_logprobs` of
the prompt both ways (B: `sample` with max_tokens 1 and prompt logprobs, what the service runs). Torch runs
on `--threads` threads (1: the service's threads and torch's pool would otherwise fight over 2 cores).
Writes `benchmarks/results/tinker_sample_overhead.json`; the figure is in docs/tinker.md ("Sampling").
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from common import spread, table, write_result

from quartet.config.model import TinyModelConfig
from quartet.models.tiny import ensure_tiny_model
from quartet.serving.tinker.adapters import AdapterHost
from quartet.serving.tinker.sampling import SampleParams, sample
from quartet.serving.tinker.server import TinkerServer

KEY = "tml-bench-key"


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1e3, out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="tiny settings (CI)")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.samples, args.tokens, args.prompt, args.rounds = 2, 4, 8, 2
    torch.set_num_threads(args.threads)
    import tinker
    from tinker import types

    with tempfile.TemporaryDirectory() as tmp:
        folder = ensure_tiny_model(TinyModelConfig(), Path(tmp))
        server = TinkerServer({"tiny": folder}, api_key=KEY)
        url = server.start_in_thread()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            client = tinker.ServiceClient(base_url=url, api_key=KEY)
        remote = client.create_sampling_client(base_model="tiny").result()
        host = AdapterHost(folder)  # what the service holds per base model; no adapter: the base

        def direct(*call: Any, **options: Any) -> Any:
            with host.active(None) as module:
                return sample(module, *call, **options)

        prompt = [(7 * i + 5) % host.vocab_size for i in range(args.prompt)]
        model_input = types.ModelInput.from_ints(prompt)
        sdk_params = types.SamplingParams(max_tokens=args.tokens, seed=1, stop=[])
        params = SampleParams(max_tokens=args.tokens, seed=1)
        cases = {
            "sample_sdk": lambda: remote.sample(model_input, args.samples, sdk_params).result(),
            "sample_direct": lambda: direct(prompt, params, args.samples),
            "logprobs_sdk": lambda: remote.compute_logprobs(model_input).result(),
            "logprobs_direct": lambda: direct(prompt, SampleParams(1), 1, prompt_logprobs=True),
        }
        for fn in cases.values():  # warm-up: first calls load and allocate
            fn()
        raw: dict[str, list[float]] = {name: [] for name in cases}
        same = True
        for _ in range(args.rounds):
            ms_a, a = _timed(cases["sample_sdk"])
            ms_b, b = _timed(cases["sample_direct"])
            raw["sample_sdk"].append(ms_a)
            raw["sample_direct"].append(ms_b)
            same = same and [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
            for name in ("logprobs_sdk", "logprobs_direct"):
                raw[name].append(_timed(cases[name])[0])
        server.stop_thread()
    stats = {name: spread(values) for name, values in raw.items()}
    summary = {
        **{f"{name}_ms": s["median"] for name, s in stats.items()},
        "sample_overhead_ms": stats["sample_sdk"]["median"] - stats["sample_direct"]["median"],
        "logprobs_overhead_ms": stats["logprobs_sdk"]["median"] - stats["logprobs_direct"]["median"],
        "same_tokens": same,
    }
    rows = [[name, s["median"], s["min"], s["max"]] for name, s in stats.items()]
    print(table(["case", "median ms", "min ms", "max ms"], rows))
    print(f"API overhead per sample call: {summary['sample_overhead_ms']:.2f} ms (same tokens: {same})")
    print(f"API overhead per compute_logprobs call: {summary['logprobs_overhead_ms']:.2f} ms")
    settings = {k: getattr(args, k) for k in ("samples", "tokens", "prompt", "rounds", "threads", "smoke")}
    print(write_result("tinker_sample_overhead", settings, raw, summary, args.out_dir))


if __name__ == "__main__":
    main()
