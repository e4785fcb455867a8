"""Tiny Qwen3-MoE folders and engine rollouts with their routing recorded, for the routing-replay tests.

`moe_folder` reinitialises the tiny MoE's matrices at a scale where every layer matters (std 1.5 /
sqrt(fan_in), as tests/rollout/test_architectures.py does), so which experts a token goes to changes its
log-probs visibly. With `tie` the rows of every router are one shared row plus noise of relative size
`tie`: the experts are nearly tied, so the rounding of a bfloat16 engine reorders them where a float32
trainer does not (the drift routing replay removes).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from quartet.config import TinyArch, TinyModelConfig
from quartet.core.batch import Batch
from quartet.models.loading import load_causal_lm
from quartet.models.moe import moe_routers
from quartet.models.tiny import ensure_tiny_model
from quartet.rollout import SamplingParams, TorchRolloutEngine, outputs_to_batch, requests_from_batch

PAD = 0


def moe_folder(root: Path, name: str, *, tie: float | None = None, seed: int = 0) -> Path:
    """A tiny Qwen3-MoE folder (8 experts, 2 per token, 2 layers), weights rescaled (see the module doc)."""
    base = ensure_tiny_model(TinyModelConfig(arch=TinyArch.QWEN3_MOE), root / "base")
    folder = root / name
    if (folder / "config.json").exists():
        return folder
    model = load_causal_lm(base)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)
        if tie is not None:
            for router in moe_routers(model):
                w = router.weight
                shared = w[:1].clone()
                w.copy_(shared + tie * shared.abs().mean() * torch.randn_like(w))
    model.save_pretrained(folder)
    for f in base.iterdir():  # the tokenizer's files
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            shutil.copy(f, folder / f.name)
    return folder


def prompt_batch(prompts: Sequence[Sequence[int]]) -> Batch:
    """Left-padded prompt rows (pad id 0) and their attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.int64)
    mask = torch.zeros(len(prompts), width, dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return Batch({"prompts": ids, "attention_mask": mask})


def record_rollout(
    folder: Path,
    dtype: torch.dtype,
    prompts: Sequence[Sequence[int]],
    max_new: Sequence[int],
    *,
    n: int = 2,
    max_num_seqs: int = 3,
    seed: int = 0,
) -> Batch:
    """Sampled responses (temperature 1, `n` per prompt, at most `max_new[i]` tokens for prompt i) from the
    built-in engine in `dtype`, recording routing; the rollout Batch (`rollout.batch_io`)."""
    rows = prompt_batch(prompts)
    sampling = SamplingParams(temperature=1.0, n=n, max_new_tokens=max(max_new), seed=seed, ignore_eos=True)
    requests = [
        dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, max_new_tokens=m))
        for r, m in zip(requests_from_batch(rows, sampling), max_new, strict=True)
    ]
    engine = TorchRolloutEngine.from_pretrained(
        folder, dtype=dtype, max_num_seqs=max_num_seqs, record_routing=True
    )
    try:
        outputs = engine.generate(requests)
    finally:
        engine.shutdown()
    return outputs_to_batch(rows, outputs, PAD, 1.0)
