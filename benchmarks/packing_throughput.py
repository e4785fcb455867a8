"""Update tokens/s, padded vs packed micro-batches (`model.remove_padding`), on the same rows and model.

Rows of varied real lengths as RL batches have them (prompts left-padded, responses right-padded): prompt
lengths uniform in [P/4, P], response lengths uniform in [R/8, R]. Each round runs one optimizer step per
path, alternating A/B, after a warm-up step each; tokens/s counts real tokens (prompt + response) only.
The padded path's waste is reported as the share of padded positions in its micro-batches.

    .venv/bin/python benchmarks/packing_throughput.py [--size demo] [--rows 64] [--micro 16] [--rounds 5]

Results: `benchmarks/results/packing_throughput_<size>.json`.
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


def rows(n: int, prompt: int, response: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(max(1, prompt // 4), prompt + 1, (n,), generator=g)
    r_len = torch.randint(max(1, response // 8), response + 1, (n,), generator=g)
    mask = torch.zeros(n, prompt + response, dtype=torch.int64)
    for i in range(n):
        mask[i, prompt - int(p_len[i]) : prompt] = 1
        mask[i, prompt : prompt + int(r_len[i])] = 1
    return Batch(
        {
            "prompts": torch.randint(5, 500, (n, prompt), generator=g),
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
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    batch = rows(args.rows, args.prompt, args.response)
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
                    remove_padding=name == "packed",
                )
            )
            for name in ("padded", "packed")
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
    summary["padded_share_of_positions"] = round(padded_share(batch, args.micro), 3)
    summary["real_tokens"] = real
    settings = vars(args) | {"threads": torch.get_num_threads()}
    settings.pop("out_dir")
    path = write_result(f"packing_throughput_{args.size}", settings, times, summary, args.out_dir)
    print(summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
