"""Routing replay (R3) on the tiny Qwen3-MoE: a bfloat16 engine beside a float32 trainer, replay off vs on.

The built-in engine, in bfloat16, samples responses and records every token's experts
(`rollout.record_routing`); a float32 training engine then computes the log-probs of the same tokens with
its own routing (`actor.routing_replay=off`) and with the engine's (`rollout`). Per case it reports, over the
response tokens the engine fed back (every response token but the last, the ones it recorded):

- |engine log-prob - trainer log-prob|: mean, p99 and max;
- `moe/routing_mismatch`: the share of (token, MoE layer) pairs whose top-k set the trainer's router picks
  differently from the engine's (with replay: what each router would have picked on the replayed pass).

Cases: `kit`, the tiny Qwen3-MoE of `model.tiny.arch=qwen3_moe` as the kit builds it (init std 0.02), and
`near_tied`, the same shape with matrices at std 1.5/sqrt(fan_in) (every layer matters) and each router's
rows one shared row plus 0.1% noise (experts nearly tied: the drift a bf16 engine makes where real routers'
top experts are close); and `wide`, a wider tiny Qwen3-MoE as the kit builds it (`WIDE`: hidden 256, 4
layers, 32 experts, top-4).

    .venv/bin/python benchmarks/moe_routing_replay.py            # 16 prompts x 4 samples x 48 tokens
    .venv/bin/python benchmarks/moe_routing_replay.py --smoke    # CI: 2 prompts x 2 samples x 6 tokens

Results: `benchmarks/results/moe_routing_replay.json`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, table, write_result  # noqa: E402

from quartet.config import Dtype, TinyArch, TinyModelConfig  # noqa: E402
from quartet.core.batch import Batch  # noqa: E402
from quartet.core.routing import fed_response_mask, mismatch_share  # noqa: E402
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine  # noqa: E402
from quartet.models.loading import load_causal_lm  # noqa: E402
from quartet.models.moe import moe_routers  # noqa: E402
from quartet.models.tiny import ensure_tiny_model  # noqa: E402
from quartet.rollout import SamplingParams, TorchRolloutEngine, generate_batch  # noqa: E402

TIE = 1e-3
WIDE = TinyModelConfig(
    arch=TinyArch.QWEN3_MOE,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    num_experts=32,
    num_experts_per_tok=4,
    moe_intermediate_size=128,
)
"""The wider case: 4 layers of 32 experts, top-4, hidden 256 (the kit's initialisation)."""


def _near_tied(base: Path, folder: Path) -> Path:
    """`base` with its matrices at std 1.5/sqrt(fan_in) and every router's rows tied up to `TIE` noise."""
    model = load_causal_lm(base)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)
        for router in moe_routers(model):
            shared = router.weight[:1].clone()
            router.weight.copy_(shared + TIE * shared.abs().mean() * torch.randn_like(router.weight))
    model.save_pretrained(folder)
    for f in base.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, folder / f.name)
    return folder


def _prompts(count: int, length: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(length // 2, length + 1, (count,), generator=g)
    ids = torch.zeros(count, length, dtype=torch.int64)
    mask = torch.zeros(count, length, dtype=torch.int64)
    for i, n in enumerate(lengths.tolist()):
        ids[i, length - n :] = torch.randint(10, vocab, (n,), generator=g)
        mask[i, length - n :] = 1
    return Batch({"prompts": ids, "attention_mask": mask})


def _summary(diff: torch.Tensor) -> dict[str, float]:
    d = diff.double()
    return {"mean": float(d.mean()), "p99": float(d.quantile(0.99)), "max": float(d.max())}


def measure(folder: Path, prompts: Batch, n: int, tokens: int) -> dict[str, Any]:
    """Engine (bf16, recording) vs trainer (fp32) log-probs of the engine's samples, replay off and on."""
    engine = TorchRolloutEngine.from_pretrained(
        folder, dtype=torch.bfloat16, max_num_seqs=16, record_routing=True
    )
    try:
        sampling = SamplingParams(temperature=1.0, n=n, max_new_tokens=tokens, seed=0, ignore_eos=True)
        rollout = generate_batch(engine, prompts, sampling, pad_token_id=0)
    finally:
        engine.shutdown()
    fed = fed_response_mask(rollout["response_mask"])
    out: dict[str, Any] = {"fed_response_tokens": int(fed.sum()), "rows": len(rollout)}
    for name, replay in (("replay_off", False), ("replay_on", True)):
        spec = EngineSpec(
            str(folder), ModelKind.CAUSAL_LM, mixed_precision=Dtype.FLOAT32, routing_replay=replay
        )
        got = TrainingEngine(spec).forward_policy(
            rollout, 1.0, MicroSpec(size=16), with_routing_mismatch=True
        )
        assert got.logprobs is not None and got.routing_mismatch is not None
        diff = (rollout["rollout_logprobs"] - got.logprobs).abs()[fed]
        share = mismatch_share(got.routing_mismatch, rollout["response_mask"])
        out[name] = {"abs_logprob_diff": _summary(diff), "routing_mismatch": share}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    prompts, n, length, tokens = (2, 2, 8, 6) if args.smoke else (16, 4, 24, 48)
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    spec = TinyModelConfig(arch=TinyArch.QWEN3_MOE)
    raw: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = ensure_tiny_model(spec, Path(tmp))
        batch = _prompts(prompts, length, spec.vocab_size)
        wide = ensure_tiny_model(WIDE, Path(tmp) / "wide")
        cases = (("kit", base), ("near_tied", _near_tied(base, Path(tmp) / "near_tied")), ("wide", wide))
        for case, folder in cases:
            raw[case] = measure(folder, batch, n, tokens)
    settings = {
        "model": "tiny qwen3_moe (kit defaults)",
        "layers": spec.num_hidden_layers,
        "experts": spec.num_experts,
        "top_k": spec.num_experts_per_tok,
        "engine_dtype": "bfloat16",
        "trainer_dtype": "float32",
        "prompts": prompts,
        "samples_per_prompt": n,
        "max_new_tokens": tokens,
        "near_tied_noise": TIE,
        "wide": {
            "hidden": WIDE.hidden_size,
            "layers": WIDE.num_hidden_layers,
            "experts": WIDE.num_experts,
            "top_k": WIDE.num_experts_per_tok,
            "moe_intermediate": WIDE.moe_intermediate_size,
        },
        "command": "benchmarks/moe_routing_replay.py" + (" --smoke" if args.smoke else ""),
    }
    summary = {
        f"{case}_{mode}_{key}": (
            r[mode]["abs_logprob_diff"][key] if key != "mismatch" else r[mode]["routing_mismatch"]
        )
        for case, r in raw.items()
        for mode in ("replay_off", "replay_on")
        for key in ("mean", "p99", "max", "mismatch")
    }
    path = write_result("moe_routing_replay", settings, raw, summary, out_dir=args.out_dir)
    rows = [
        [
            case,
            mode,
            f"{r[mode]['abs_logprob_diff']['mean']:.2e}",
            f"{r[mode]['abs_logprob_diff']['p99']:.2e}",
        ]
        + [f"{r[mode]['abs_logprob_diff']['max']:.2e}", f"{r[mode]['routing_mismatch']:.4f}"]
        for case, r in raw.items()
        for mode in ("replay_off", "replay_on")
    ]
    print(table(["case", "mode", "|d logp| mean", "p99", "max", "routing mismatch"], rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
