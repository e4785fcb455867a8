"""Dense vs MoE of equal active parameters on this CPU: update step time, old-log-prob pass time, peak memory,
and the built-in engine's decode tokens/s.

The two models are those of the examples: the tiny dense Qwen2 of examples/grpo_arithmetic (1,050,752
parameters) and the tiny Qwen3-MoE of examples/moe (1,054,080 active per token of 3,413,376: 8 experts of
width 256, 2 per token), with its router loss coefficients (aux 0.01, z 0.001) in the update. Both see the
same batch (random tokens, random advantages, a policy-gradient token-mean loss, the demo's shape: 256 rows
of 24 prompt and 8 response tokens, one micro-batch) in one float32 training engine each, in one process.

A CPU shared with other work is noisy, so the two are measured in turns, A/B/A/B (dense, MoE, dense, MoE,
...: a load that comes and goes bends both alike) and each figure is the median of its turns after the
first (which allocates Adam's states and warms the kernels); the ratios MoE / dense are of one run.

- `update_s`: one `train_step` (forward, backward, the router's losses for the MoE, one optimizer step);
- `small_update_s`: one `train_step` on 32 rows of 8 + 8 tokens, the size of the demo's SFT steps, where
  fixed costs per layer (the MoE's routing, gathers and hooks) weigh most (the median of 5 per turn);
- `logprob_s`: one `forward_policy` (the old-log-prob pass, no gradient);
- `update_peak_mib`, `logprob_peak_mib`: the resident set's peak increase during the call over the resident
  set before it (`quartet.planning.measure`: VmHWM reset before the call; the script re-runs itself with
  `MALLOC_MMAP_THRESHOLD_` at 64 KiB so that freed tensors go back to the OS, as
  benchmarks/expert_parallel.py does);
- `param_mib`, `adam_mib`: the exact bytes of the parameters and of Adam's states (all experts for the MoE);
- `decode_tok_s`: generated tokens per second of `TorchRolloutEngine` (float32, the demo's 256 sequences,
  `ignore_eos`), the whole `generate` call timed.

    .venv/bin/python benchmarks/moe_cost.py          # the committed table: benchmarks/results/moe_cost.json
    .venv/bin/python benchmarks/moe_cost.py --smoke  # CI: 8 rows, 2 turns, 4 new tokens
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, table, write_result  # noqa: E402
from expert_parallel import pg_loss, rows, trim_heap  # noqa: E402

from quartet.config import Dtype, TinyArch, TinyModelConfig  # noqa: E402
from quartet.config.optim import OptimConfig  # noqa: E402
from quartet.core.batch import Batch  # noqa: E402
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine  # noqa: E402
from quartet.models.tiny import ensure_tiny_model  # noqa: E402
from quartet.planning.measure import current_rss_bytes, peak_rss_bytes, reset_peak_rss  # noqa: E402
from quartet.planning.model_shape import shape_from_tiny  # noqa: E402
from quartet.rollout import SamplingParams, TorchRolloutEngine, generate_batch  # noqa: E402

TRUNK = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
MODELS = {
    "dense": TinyModelConfig(**TRUNK, intermediate_size=512),  # examples/grpo_arithmetic
    "moe": TinyModelConfig(  # examples/moe
        **TRUNK,
        arch=TinyArch.QWEN3_MOE,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
    ),
}
"""The two models; tests/benchmarks/test_bench_moe_cost.py holds them equal to the examples' `model.tiny`."""
ROUTER = {"moe_aux_loss_coef": 0.01, "moe_z_loss_coef": 0.001}
"""examples/moe's router loss coefficients (a dense model ignores them)."""
MMAP_THRESHOLD = str(64 * 1024)


def timed(call: Callable[[], Any]) -> tuple[float, int]:
    """(seconds, peak resident-set increase in bytes) of one call."""
    trim_heap()
    before = current_rss_bytes()
    reset_peak_rss()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start, peak_rss_bytes() - before


def engine_for(folder: Path) -> TrainingEngine:
    """A float32 training engine on one process, Adam without decay or clipping, the router's losses on."""
    optim = OptimConfig(lr=1e-4, weight_decay=0.0, grad_clip=0.0)
    spec = EngineSpec(str(folder), ModelKind.CAUSAL_LM, Dtype.FLOAT32, optim=optim, **ROUTER)  # type: ignore[arg-type]
    return TrainingEngine(spec)


def state_bytes(engine: TrainingEngine) -> tuple[int, int]:
    """(parameter bytes, Adam state bytes) of an engine."""
    params = sum(p.numel() * p.element_size() for p in engine.module.parameters())
    assert engine.optimizer is not None
    states = [v for s in engine.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return params, sum(v.numel() * v.element_size() for v in states)


def decode_rate(folder: Path, prompts: Batch, n: int, tokens: int) -> float:
    """Generated tokens per second of the built-in engine over `prompts` x `n` samples of `tokens` tokens."""
    with TorchRolloutEngine.from_pretrained(folder, max_num_seqs=len(prompts) * n) as engine:
        sampling = SamplingParams(temperature=1.0, n=n, max_new_tokens=tokens, seed=0, ignore_eos=True)
        start = time.perf_counter()
        out = generate_batch(engine, prompts, sampling, pad_token_id=0)
        seconds = time.perf_counter() - start
    return float(out["response_mask"].sum()) / seconds


def measure(
    folders: dict[str, Path], batch: Batch, turns: int, decode: tuple[Batch, int, int], small: Batch
) -> dict[str, Any]:
    """Every figure of each model, measured in turns A/B/A/B; the raw per-turn lists."""
    engines = {name: engine_for(folder) for name, folder in folders.items()}
    micro, small_micro = MicroSpec(size=len(batch)), MicroSpec(size=len(small))
    raw: dict[str, dict[str, list[float]]] = {name: {} for name in folders}
    for _ in range(turns):
        for name, engine in engines.items():
            figures = raw[name]
            seconds, peak = timed(lambda engine=engine: engine.train_step(batch, pg_loss, micro))  # type: ignore[misc]
            figures.setdefault("update_s", []).append(seconds)
            figures.setdefault("update_peak_bytes", []).append(peak)
            seconds, peak = timed(lambda engine=engine: engine.forward_policy(batch, 1.0, micro))  # type: ignore[misc]
            figures.setdefault("logprob_s", []).append(seconds)
            figures.setdefault("logprob_peak_bytes", []).append(peak)
            step = engine.train_step  # the SFT start's step: 32 short rows (median of 5 a turn)
            times = [timed(lambda step=step: step(small, pg_loss, small_micro))[0] for _ in range(5)]  # type: ignore[misc]
            figures.setdefault("small_update_s", []).append(statistics.median(times))
    for name, engine in engines.items():
        params, adam = state_bytes(engine)
        raw[name]["param_bytes"] = [params]
        raw[name]["adam_bytes"] = [adam]
    del engines
    trim_heap()
    for _ in range(turns):
        for name, folder in folders.items():
            raw[name].setdefault("decode_tok_s", []).append(decode_rate(folder, *decode))
    return raw


def summarize(raw: dict[str, list[float]]) -> dict[str, float]:
    """Medians over the turns after the first (all of them when there is one)."""

    def med(key: str) -> float:
        values = raw[key][1:] or raw[key]
        return float(statistics.median(values))

    return {
        "update_s": med("update_s"),
        "small_update_s": med("small_update_s"),
        "logprob_s": med("logprob_s"),
        "update_peak_mib": med("update_peak_bytes") / 2**20,
        "logprob_peak_mib": med("logprob_peak_bytes") / 2**20,
        "param_mib": raw["param_bytes"][0] / 2**20,
        "adam_mib": raw["adam_bytes"][0] / 2**20,
        "decode_tok_s": med("decode_tok_s"),
    }


KEYS = [
    "update_s",
    "small_update_s",
    "logprob_s",
    "update_peak_mib",
    "logprob_peak_mib",
    "param_mib",
    "adam_mib",
    "decode_tok_s",
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--turns", type=int, default=7, help="turns per model (the first warms up)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:  # glibc reads it at start: run again
        os.environ["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD
        os.execv(sys.executable, [sys.executable, *sys.argv])
    count, prompt, response, turns = (8, 8, 4, 2) if args.smoke else (256, 24, 8, args.turns)
    decode_prompts, n, new = (2, 2, 4) if args.smoke else (32, 8, 32)
    vocab = MODELS["dense"].vocab_size
    batch = rows(count, prompt, response, vocab=vocab)
    ids = rows(decode_prompts, prompt, 0, seed=1, vocab=vocab)["prompts"]
    prompts = Batch({"prompts": ids, "attention_mask": torch.ones_like(ids)})
    with tempfile.TemporaryDirectory() as tmp:
        folders = {name: ensure_tiny_model(spec, Path(tmp) / name) for name, spec in MODELS.items()}
        small = rows(2 if args.smoke else 32, 8, 8, seed=2, vocab=vocab)
        raw = measure(folders, batch, turns, (prompts, n, new), small)
    summary = {name: summarize(figures) for name, figures in raw.items()}
    ratios = {k: summary["moe"][k] / summary["dense"][k] for k in KEYS}
    shapes = {name: shape_from_tiny(spec) for name, spec in MODELS.items()}
    settings = {
        "rows": count,
        "prompt_tokens": prompt,
        "response_tokens": response,
        "small_rows": 2 if args.smoke else 32,
        "small_tokens": "8+8",
        "turns": turns,
        "decode": {"prompts": decode_prompts, "samples": n, "new_tokens": new, "dtype": "float32"},
        "dtype": "float32",
        "torch_threads": torch.get_num_threads(),
        "params": {name: s.total_params for name, s in shapes.items()},
        "active_params": {name: s.active_params for name, s in shapes.items()},
        "router": ROUTER,
        "command": "benchmarks/moe_cost.py" + (" --smoke" if args.smoke else ""),
    }
    path = write_result(
        "moe_cost", settings, raw, {**summary, "moe_over_dense": ratios}, out_dir=args.out_dir
    )
    headers = [
        "model",
        "update s",
        "small update s",
        "logprob s",
        "update peak MiB",
        "logprob peak MiB",
        "params MiB",
    ]
    headers += ["Adam MiB", "decode tok/s"]
    body = [[name, *(summary[name][k] for k in KEYS)] for name in MODELS]
    body.append(["moe / dense", *(ratios[k] for k in KEYS)])
    print(f"{count} rows of {prompt}+{response} tokens; decode {decode_prompts} x {n} x {new} tokens")
    print(table(headers, body))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
