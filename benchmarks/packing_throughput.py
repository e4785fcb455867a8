"""Update tokens/s: padded, packed (`model.remove_padding`) and packed with each prompt once per group of
rows that share it (`model.shared_prompts`), on the same rows and model.

Rows of varied real lengths as RL batches have them (prompts left-padded, responses right-padded): prompt
lengths uniform in [P/4, P], response lengths uniform in [R/8, R]; with `--n` > 1 every n consecutive rows
share their prompt (GRPO's n samples of one prompt). Each round runs one optimizer step per path, in turn,
after a warm-up step each; tokens/s counts the rows' real tokens (prompt + response, a shared prompt once
per row as the task has it) on every path, so the paths compare on the same work. The padded path's waste
is reported as the share of padded positions in its micro-batches.

    .venv/bin/python benchmarks/packing_throughput.py [--size demo] [--rows 64] [--micro 16] [--rounds 5]
    .venv/bin/python benchmarks/packing_throughput.py --size 20M --rows 64 --n 4 --micro 64 --prompt 20 \
        --response 32 --rounds 3        # the GRPO step of benchmarks/grpo_vs_trl.py at 20M, one thread

Results: `benchmarks/results/packing_throughput_<size>.json` (`..._n<n>.json` with `--n` > 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402
from grpo_runs import SIZES  # noqa: E402

from quartet.config.model import Dtype, TinyModelConfig  # noqa: E402
from quartet.config.optim import OptimConfig  # noqa: E402
from quartet.core.batch import Batch  # noqa: E402
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine  # noqa: E402
from quartet.models.tiny import save_tiny_model  # noqa: E402


def rows(n: int, prompt: int, response: int, seed: int = 0, group: int = 1) -> Batch:
    """`n` rows; every `group` consecutive rows have the same prompt (tokens and length)."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(max(1, prompt // 4), prompt + 1, (n,), generator=g)
    leader = torch.arange(n) // group * group
    p_len = p_len[leader]
    r_len = torch.randint(max(1, response // 8), response + 1, (n,), generator=g)
    mask = torch.zeros(n, prompt + response, dtype=torch.int64)
    for i in range(n):
        mask[i, prompt - int(p_len[i]) : prompt] = 1
        mask[i, prompt : prompt + int(r_len[i])] = 1
    return Batch(
        {
            "prompts": torch.randint(5, 500, (n, prompt), generator=g)[leader],
            "responses": torch.randint(5, 500, (n, response), generator=g),
            "attention_mask": mask,
            "response_mask": mask[:, prompt:].clone(),
            "advantages": torch.randn(n, response, generator=g),
        }
    )


def loss(outputs: Any, mb: Batch, scale: Any) -> tuple[torch.Tensor, dict[str, float]]:
    m = mb["response_mask"].to(outputs.logprobs.device)
    return -(outputs.logprobs * mb["advantages"].to(m.device) * m).sum() / scale.tokens, {}


def padded_share(batch: Batch, micro: int) -> float:
    """Padded positions over all positions in the padded path's (trimmed) micro-batches."""
    mask = batch["attention_mask"]
    waste = total = 0
    for part in torch.split(mask, micro):
        cols = part.any(0).nonzero()
        width = int(cols[-1] - cols[0] + 1)
        total += part.shape[0] * width
        waste += part.shape[0] * width - int(part.sum())
    return waste / total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="demo", choices=sorted(SIZES))
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=1, help="consecutive rows sharing a prompt")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch = rows(args.rows, args.prompt, args.response, group=args.n)
    real = int(batch["attention_mask"].sum())
    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny_model(Path(tmp) / "m", TinyModelConfig(**SIZES[args.size]))
        engines = {
            name: TrainingEngine(
                EngineSpec(
                    str(model),
                    ModelKind.CAUSAL_LM,
                    Dtype(args.dtype),
                    optim=OptimConfig(lr=1e-5),
                    remove_padding=name != "padded",
                    shared_prompts=name == "shared",
                )
            )
            for name in ("padded", "packed", "shared")
        }
        micro = MicroSpec(size=args.micro)
        times: dict[str, list[float]] = {name: [] for name in engines}
        for engine in engines.values():
            engine.train_step(batch, loss, micro, temperature=1.0)  # warm-up
        for _ in range(args.rounds):
            for name, engine in engines.items():
                t0 = time.perf_counter()
                engine.train_step(batch, loss, micro, temperature=1.0)
                times[name].append(time.perf_counter() - t0)
    summary = {
        name: {
            "step_s_median": round(statistics.median(t), 4),
            "tokens_per_s": round(real / statistics.median(t), 1),
        }
        for name, t in times.items()
    }
    summary["packed_over_padded"] = round(
        summary["packed"]["tokens_per_s"] / summary["padded"]["tokens_per_s"], 3
    )
    summary["shared_over_packed"] = round(
        summary["shared"]["tokens_per_s"] / summary["packed"]["tokens_per_s"], 3
    )
    summary["shared_over_padded"] = round(
        summary["shared"]["tokens_per_s"] / summary["padded"]["tokens_per_s"], 3
    )
    summary["padded_share_of_positions"] = round(padded_share(batch, args.micro), 3)
    summary["real_tokens"] = real
    settings = vars(args) | {"threads": torch.get_num_threads()}
    settings.pop("out_dir")
    name = f"packing_throughput_{args.size}" + (f"_n{args.n}" if args.n > 1 else "")
    path = write_result(name, settings, times, summary, args.out_dir)
    print(summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
