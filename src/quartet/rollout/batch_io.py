"""From a `Batch` of prompts to a `Batch` of sampled responses, in the column layout the trainer reads.

Input columns: `prompts` [B, P] int64 left-padded, `attention_mask` [B, P] (1 = real prompt token); any other
tensor or non-tensor columns (`uid`, ground truths, ...) are carried along.

Output, with n samples per prompt (sample j of prompt i at row i*n + j, every input column repeated so):
    prompts [B*n, P] int64, responses [B*n, R] int64 right-padded with `pad_token_id`,
    response_mask [B*n, R] int64 (1 = token written by the model, the stop token included; 0 after it),
    attention_mask [B*n, P+R] int64 (the prompt mask followed by response_mask),
    rollout_logprobs [B*n, R] float32 (0 on padding; only when the sampling asks for log-probs),
    rollout_versions [B*n, R] int64: the engine's weight version behind each token (0 on padding; only
        from engines that tag tokens, see `GenerationOutput.versions`),
    routed_experts [B*n, P+R, L, k] uint8/int16: the MoE routing the engine recorded for each token it fed
        (prompt and response, aligned with prompts + responses; 0 on padding and on each response's last
        token; only from an engine that records it, `rollout.record_routing`; `quartet.core.routing`),
    finish_reason: non-tensor column of "stop" / "length" / "abort".
R is the longest response (`pad_rollout` widens it, e.g. to the response limit so that data-parallel ranks'
batches join). `meta.temperature` is set to the temperature the log-probs were computed at
(1.0 for greedy decoding; see `quartet.rollout.types`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from quartet.core.batch import Batch, BatchError
from quartet.core.routing import ROUTED_EXPERTS
from quartet.rollout.base import RolloutEngine
from quartet.rollout.types import GenerationOutput, GenerationRequest, SamplingParams

__all__ = ["concat_rollouts", "generate_batch", "outputs_to_batch", "pad_rollout", "requests_from_batch"]


def requests_from_batch(batch: Batch, sampling: SamplingParams) -> list[GenerationRequest]:
    """One request per row: the row's real prompt tokens (padding removed).

    With a seed, row i gets seed `sampling.seed + i`, so different prompts use different random streams.
    """
    prompts, mask = batch["prompts"], batch["attention_mask"]
    if mask.shape != prompts.shape:
        raise BatchError(
            f"attention_mask {tuple(mask.shape)} must cover exactly the prompts {tuple(prompts.shape)}"
        )
    requests = []
    multi_modal = batch.non_tensors.get("multi_modal_inputs")
    images = batch.non_tensors.get("images")
    for i in range(len(batch)):
        ids = prompts[i][mask[i] != 0].tolist()
        params = sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + i)
        mm = multi_modal[i] if multi_modal is not None else None
        if mm is not None and images is not None:
            mm = {**mm, "images": list(images[i])}
        requests.append(GenerationRequest(tuple(ids), params, multi_modal=mm))
    return requests


def _response_tensors(
    flat: list[GenerationOutput], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """responses [N, R] int64, response_mask [N, R] int64, logprobs [N, R] float32 of N outputs."""
    width = max(len(o.token_ids) for o in flat)
    responses = torch.full((len(flat), width), pad_token_id, dtype=torch.int64)
    mask = torch.zeros(len(flat), width, dtype=torch.int64)
    logprobs = torch.zeros(len(flat), width, dtype=torch.float32)
    for row, out in enumerate(flat):
        length = len(out.token_ids)
        if length:
            responses[row, :length] = torch.tensor(out.token_ids, dtype=torch.int64)
            mask[row, :length] = 1
            if out.logprobs is not None:
                logprobs[row, :length] = torch.tensor(out.logprobs, dtype=torch.float32)
    return responses, mask, logprobs


def _versions(flat: list[GenerationOutput], width: int) -> torch.Tensor:
    """The per-token weight versions [N, width] of outputs that carry them (0 past each response)."""
    versions = torch.zeros(len(flat), width, dtype=torch.int64)
    for row, out in enumerate(flat):
        if out.versions:
            versions[row, : len(out.versions)] = torch.tensor(out.versions, dtype=torch.int64)
    return versions


def _routing(flat: list[GenerationOutput], prompt_mask: torch.Tensor, width: int) -> torch.Tensor | None:
    """The recorded routing of `flat` laid over prompts [N, P] (left-padded) + responses [N, width], or None
    when no output carries one. A row without a record (aborted before it was admitted) holds zeros."""
    records = [o.routed_experts for o in flat]
    first = next((r for r in records if r is not None), None)
    if first is None:
        return None
    p = prompt_mask.shape[1]
    out = torch.zeros(len(flat), p + width, *first.shape[1:], dtype=first.dtype)
    for row, record in enumerate(records):
        if record is None:
            continue
        prompt_cols = prompt_mask[row].nonzero().squeeze(1)
        plen = int(prompt_cols.numel())
        fed = record.shape[0] - plen  # response tokens fed back: all but the last
        if fed < 0 or fed > len(flat[row].token_ids):
            raise BatchError(
                f"row {row}: a routing record of {record.shape[0]} tokens for a prompt of {plen} and a "
                f"response of {len(flat[row].token_ids)}"
            )
        out[row, prompt_cols] = record[:plen]
        out[row, p : p + fed] = record[plen:]
    return out


def outputs_to_batch(
    prompts: Batch, outputs: list[list[GenerationOutput]], pad_token_id: int, temperature: float
) -> Batch:
    """The response batch (layout in the module docstring) of `outputs[i][j]`, sample j of prompt row i."""
    if len(outputs) != len(prompts):
        raise BatchError(f"{len(outputs)} output lists for a batch of {len(prompts)} prompts")
    n = len(outputs[0]) if outputs else 1
    if any(len(o) != n for o in outputs):
        raise BatchError(f"every prompt needs the same number of samples; got {[len(o) for o in outputs]}")
    flat = [o for outs in outputs for o in outs]
    responses, response_mask, logprobs = _response_tensors(flat, pad_token_id)
    base = prompts.repeat(n, interleave=True)
    columns = {
        "responses": responses,
        "response_mask": response_mask,
        "attention_mask": torch.cat([base["attention_mask"].to(torch.int64), response_mask], dim=1),
    }
    if all(o.logprobs is not None for o in flat):
        columns["rollout_logprobs"] = logprobs
    if all(o.versions is not None and len(o.versions) == len(o.token_ids) for o in flat):
        columns["rollout_versions"] = _versions(flat, responses.shape[1])
    routing = _routing(flat, base["attention_mask"] != 0, responses.shape[1])
    if routing is not None:
        columns[ROUTED_EXPERTS] = routing
    finish = np.array([str(o.finish_reason) for o in flat], dtype=object)
    generated = Batch(columns, {"finish_reason": finish}, batch_size=len(flat))
    meta_temperature = temperature if temperature > 0 else 1.0
    return base.drop("attention_mask").union(generated).with_meta(temperature=meta_temperature)


def generate_batch(
    engine: RolloutEngine, prompts: Batch, sampling: SamplingParams, pad_token_id: int
) -> Batch:
    """Sample `sampling.n` responses per prompt row of `prompts` with `engine` (layout in the module doc)."""
    outputs = engine.generate(requests_from_batch(prompts, sampling))
    return outputs_to_batch(prompts, outputs, pad_token_id, sampling.temperature)


def pad_rollout(batch: Batch, prompt_width: int, response_width: int, pad_token_id: int) -> Batch:
    """`batch` (the layout above, plus any response-aligned [B, R] columns such as scores, and
    sequence-aligned [B, P+R] ones such as `routed_experts`) padded to [B, prompt_width] prompts (on the
    left) and [B, response_width] responses (on the right).

    Padding is `pad_token_id` in `prompts`/`responses` and 0 elsewhere, so masks mark it as padding; the
    training engines trim columns that are padding in every row, so a wider batch costs no compute.
    """
    prompts, mask = batch["prompts"], batch["attention_mask"]
    p, total = prompts.shape[1], mask.shape[1]
    r = total - p
    if prompt_width < p or response_width < r:
        raise BatchError(f"cannot pad a [{p} + {r}] rollout down to [{prompt_width} + {response_width}]")
    left, right = prompt_width - p, response_width - r
    if not left and not right:
        return batch
    columns: dict[str, torch.Tensor] = {}
    for name, value in batch.columns().items():
        fill = pad_token_id if name in ("prompts", "responses") else 0
        if name == "prompts":
            columns[name] = torch.nn.functional.pad(value, (left, 0), value=fill)
        elif name == "attention_mask":
            columns[name] = torch.nn.functional.pad(value, (left, right), value=0)
        elif value.dim() >= 2 and value.shape[1] == total:  # prompt + response aligned (routed_experts)
            widths = (0, 0) * (value.dim() - 2) + (left, right)
            columns[name] = torch.nn.functional.pad(value, widths, value=0)
        elif value.dim() >= 2 and value.shape[1] == r:
            widths = (0, 0) * (value.dim() - 2) + (0, right)  # F.pad lists the last dimension first
            columns[name] = torch.nn.functional.pad(value, widths, value=fill)
        elif value.dim() >= 2:
            raise BatchError(
                f"column '{name}' {tuple(value.shape)} is neither prompt- ({p}) nor response-aligned ({r})"
            )
        else:
            columns[name] = value
    return Batch(columns, dict(batch.non_tensors), batch.meta, batch_size=len(batch))


def concat_rollouts(batches: Sequence[Batch], pad_token_id: int) -> Batch:
    """Rows of rollout batches of different prompt/response widths, in order (padded to the widest)."""
    if not batches:
        raise BatchError("concat_rollouts needs at least one batch")
    prompt_width = max(b["prompts"].shape[1] for b in batches)
    response_width = max(b["attention_mask"].shape[1] - b["prompts"].shape[1] for b in batches)
    return Batch.concat([pad_rollout(b, prompt_width, response_width, pad_token_id) for b in batches])
