"""What the GKD tests share (imported as `gkd_cases`, as `distill_settings` is): the reference log-probs
computed by transformers alone, row by row on the real tokens."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from quartet.core.batch import Batch

TEMPERATURE = 0.7


def full_logprobs(model_dir: Path, batch: Batch) -> list[torch.Tensor]:
    """Per row: [r, V] float64 log-softmax(logits / T) at the positions predicting its r response tokens,
    from transformers' forward on the row's real tokens alone (no padding, no quartet code)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    p = batch["prompts"].shape[1]
    for i in range(len(batch)):
        mask = batch["attention_mask"][i].bool()
        ids = torch.cat([batch["prompts"][i], batch["responses"][i]])[mask]
        r = int(mask[p:].sum())
        with torch.no_grad():
            logits = model(input_ids=ids.unsqueeze(0)).logits[0].double()
        out.append(torch.log_softmax(logits[-r - 1 : -1] / TEMPERATURE, dim=-1))
    return out
