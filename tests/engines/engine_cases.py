"""Batches with padding on both sides, and slow per-row references computed WITHOUT any padding.

Padding positions hold random tokens (not the pad id), so a result that leaks padding shows up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from quartet.core.batch import Batch, BatchMeta
from quartet.engines import LossScale, ModelOutputs, TrainingEngine
from quartet.engines.inputs import build_inputs


def make_batch(
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    *,
    prompt_width: int | None = None,
    response_width: int | None = None,
    vocab: int = 500,
    seed: int = 0,
    temperature: float = 1.0,
) -> Batch:
    """Rows with the given real prompt/response lengths, left/right padded with random junk tokens."""
    g = torch.Generator().manual_seed(seed)
    b = len(prompt_lens)
    p = prompt_width or max(prompt_lens)
    r = response_width if response_width is not None else max(response_lens)
    prompts = torch.randint(10, vocab, (b, p), generator=g)
    responses = torch.randint(10, vocab, (b, r), generator=g)
    mask = torch.zeros(b, p + r, dtype=torch.int64)
    for i, (pl, rl) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        mask[i, p - pl : p] = 1
        mask[i, p : p + rl] = 1
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "attention_mask": mask,
        "response_mask": mask[:, p:].clone(),
        "advantages": torch.randn(b, r, generator=g),
        "targets": torch.randn(b, r, generator=g),
    }
    return Batch(tensors, meta=BatchMeta(temperature=temperature))


def repad(batch: Batch, extra_left: int, extra_right: int, seed: int = 1) -> Batch:
    """The same rows with more padding columns (new random junk in every padded position)."""
    g = torch.Generator().manual_seed(seed)
    mask = batch["attention_mask"]
    p, r = batch["prompts"].shape[1], batch["responses"].shape[1]
    junk_p = torch.randint(10, 500, (len(batch), p + extra_left), generator=g)
    junk_r = torch.randint(10, 500, (len(batch), r + extra_right), generator=g)
    pm, rm = mask[:, :p] != 0, mask[:, p:] != 0
    junk_p[:, extra_left:][pm] = batch["prompts"][pm]
    junk_r[:, :r][rm] = batch["responses"][rm]
    new_mask = torch.cat(
        [
            torch.zeros(len(batch), extra_left, dtype=mask.dtype),
            mask,
            torch.zeros(len(batch), extra_right, dtype=mask.dtype),
        ],
        dim=1,
    )
    pad = torch.zeros(len(batch), extra_right)
    tensors = {
        "prompts": junk_p,
        "responses": junk_r,
        "attention_mask": new_mask,
        "response_mask": new_mask[:, p + extra_left :].clone(),
        "advantages": torch.cat([batch["advantages"], pad], dim=1),
        "targets": torch.cat([batch["targets"], pad], dim=1),
    }
    return Batch(tensors, meta=batch.meta)


def unpadded_rows(batch: Batch) -> list[tuple[torch.Tensor, int, int]]:
    """(ids [n], prompt length, response length) of each row, padding removed."""
    p = batch["prompts"].shape[1]
    out = []
    for i in range(len(batch)):
        m = batch["attention_mask"][i] != 0
        prompt = batch["prompts"][i][m[:p]]
        response = batch["responses"][i][m[p:]]
        out.append((torch.cat([prompt, response]), len(prompt), len(response)))
    return out


def reference_logprobs(
    model: nn.Module, batch: Batch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, unpadded: log_softmax(model(ids).logits / T) gathered at the response tokens; and entropy."""
    r = batch["responses"].shape[1]
    logprobs = torch.zeros(len(batch), r)
    entropy = torch.zeros(len(batch), r)
    for i, (ids, pl, rl) in enumerate(unpadded_rows(batch)):
        logits = model(ids[None]).logits[0].float() / temperature
        logp = torch.log_softmax(logits, dim=-1)
        rows = logp[pl - 1 : pl + rl - 1]
        logprobs[i, :rl] = rows.gather(1, ids[pl:, None]).squeeze(1)
        entropy[i, :rl] = -(rows.exp() * rows).sum(-1)
    return logprobs, entropy


def pg_loss(outputs: ModelOutputs, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, Mapping[str, float]]:
    """-sum(advantage * logprob) / global tokens (token-mean with the global count)."""
    assert outputs.logprobs is not None
    valid = mb["response_mask"] != 0
    per_token = -mb["advantages"] * outputs.logprobs
    loss = torch.where(valid, per_token, 0.0).sum() / scale.tokens
    return loss, {"mb_rows": float(len(mb))}


def seq_mean_loss(
    outputs: ModelOutputs, mb: Batch, scale: LossScale
) -> tuple[torch.Tensor, Mapping[str, float]]:
    """sum over rows of the row's token-mean of -adv*logprob, / global sequences (seq-mean-token-mean)."""
    assert outputs.logprobs is not None
    valid = mb["response_mask"] != 0
    per_row = torch.where(valid, -mb["advantages"] * outputs.logprobs, 0.0).sum(-1)
    per_row = per_row / valid.sum(-1).clamp(min=1)
    return per_row.sum() / scale.sequences, {}


def value_mse(outputs: ModelOutputs, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, Mapping[str, float]]:
    """Token-mean squared error of values to the `targets` column."""
    assert outputs.values is not None
    valid = mb["response_mask"] != 0
    err = torch.where(valid, (outputs.values - mb["targets"]) ** 2, 0.0)
    return err.sum() / scale.tokens, {}


def surrogate_grads(engine: TrainingEngine, batch: Batch, temperature: float) -> dict[str, torch.Tensor]:
    """The gradients of sum(logprob * advantage) + 0.1 * sum(entropy) over `batch` in one engine pass."""
    engine.module.zero_grad(set_to_none=True)
    outputs = engine._run(batch, build_inputs(batch), temperature, with_entropy=True)
    assert outputs.logprobs is not None and outputs.entropy is not None
    loss = (outputs.logprobs * batch["advantages"]).sum() + 0.1 * outputs.entropy.sum()
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in engine.module.named_parameters() if p.grad is not None}
