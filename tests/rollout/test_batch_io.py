"""Prompts Batch -> responses Batch: layout, masks and repeated columns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from rollout_cases import prompt_ids, recompute_logprobs, shared_model, tokenizer

from quartet.core.batch import Batch, BatchError
from quartet.rollout import (
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    RolloutEngine,
    SamplingParams,
    TorchRolloutEngine,
    generate_batch,
    requests_from_batch,
)

PAD = 0


def left_padded(prompts: list[list[int]]) -> Batch:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    uid = np.array([f"q{i}" for i in range(len(prompts))], dtype=object)
    extra = torch.arange(len(prompts)) * 10
    return Batch({"prompts": ids, "attention_mask": mask, "score_hint": extra}, {"uid": uid})


class ScriptedEngine(RolloutEngine):
    """Returns responses of known lengths: sample j of a prompt of length L has L + j tokens."""

    def __init__(self) -> None:
        self.seen: list[GenerationRequest] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[GenerationOutput]]:
        self.seen.extend(requests)
        out = []
        for r in requests:
            samples = []
            for j in range(r.sampling.n):
                length = len(r.prompt_token_ids) + j
                ids = tuple(100 + j for _ in range(length))
                reason = FinishReason.STOP if j == 0 else FinishReason.LENGTH
                lps = tuple(-0.5 - j for _ in range(length))
                samples.append(GenerationOutput(r.request_id, j, ids, lps, reason))
            out.append(samples)
        return out

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None
    ) -> int:
        return 0

    def sleep(self, offload_weights: bool = False) -> None:
        pass

    def wake(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def test_layout_masks_and_repeated_columns() -> None:
    prompts = [[5, 6], [7, 8, 9, 10], [11]]
    batch = left_padded(prompts)
    engine = ScriptedEngine()
    out = generate_batch(engine, batch, SamplingParams(temperature=0.8, n=2, seed=3), pad_token_id=PAD)

    assert [r.prompt_token_ids for r in engine.seen] == [tuple(p) for p in prompts]  # padding removed
    assert [r.sampling.seed for r in engine.seen] == [3, 4, 5]  # one stream per prompt
    assert len(out) == 6
    lengths = [2, 3, 4, 5, 1, 2]  # prompt length + sample index, row i*n + j
    width = 5
    assert out["responses"].shape == (6, width)
    assert torch.equal(out["prompts"], batch["prompts"].repeat_interleave(2, dim=0))
    assert list(out["uid"]) == ["q0", "q0", "q1", "q1", "q2", "q2"]
    assert out["score_hint"].tolist() == [0, 0, 10, 10, 20, 20]
    assert list(out["finish_reason"]) == ["stop", "length"] * 3
    for row, length in enumerate(lengths):
        j = row % 2
        assert out["responses"][row, :length].tolist() == [100 + j] * length
        assert out["responses"][row, length:].tolist() == [PAD] * (width - length)
        assert out["response_mask"][row].tolist() == [1] * length + [0] * (width - length)
        assert out["rollout_logprobs"][row, :length].tolist() == [-0.5 - j] * length
        assert out["rollout_logprobs"][row, length:].abs().sum() == 0
    p_width = batch["prompts"].shape[1]
    assert out["attention_mask"].shape == (6, p_width + width)
    assert torch.equal(
        out["attention_mask"][:, :p_width], batch["attention_mask"].repeat_interleave(2, dim=0)
    )
    assert torch.equal(out["attention_mask"][:, p_width:], out["response_mask"])
    assert out.meta.temperature == 0.8


def test_mask_must_cover_the_prompts() -> None:
    batch = left_padded([[1, 2]])
    bad = Batch({"prompts": batch["prompts"], "attention_mask": torch.ones(1, 5, dtype=torch.int64)})
    with pytest.raises(BatchError, match="cover"):
        requests_from_batch(bad, SamplingParams())


def test_real_engine_batch_matches_recomputed_logprobs(tiny_model_dir: Path) -> None:
    model = shared_model(tiny_model_dir)
    prompts = prompt_ids(tiny_model_dir)[:3]
    pad = tokenizer(tiny_model_dir).pad_token_id
    batch = left_padded(prompts)
    # many stop ids make lengths differ, so the right padding and masks are exercised
    stop_ids = tuple(range(0, len(tokenizer(tiny_model_dir)), 7))
    params = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, seed=0, stop_token_ids=stop_ids)
    with TorchRolloutEngine(model, max_num_seqs=4) as eng:
        out = generate_batch(eng, batch, params, pad_token_id=pad)
    p_width = batch["prompts"].shape[1]
    lengths = out["response_mask"].sum(dim=1).tolist()
    assert min(lengths) < max(lengths)
    for row in range(len(out)):
        n_resp = lengths[row]
        response = out["responses"][row, :n_resp].tolist()
        assert out["responses"][row, n_resp:].eq(pad).all()
        finished_by_stop = out["finish_reason"][row] == "stop"
        assert finished_by_stop == (response[-1] in stop_ids)
        prompt = prompts[row // 2]
        ref = recompute_logprobs(model, prompt, response, 1.0)
        torch.testing.assert_close(out["rollout_logprobs"][row, :n_resp], ref, atol=1e-4, rtol=0)
        assert out["attention_mask"][row].sum() == len(prompt) + n_resp
        assert out["attention_mask"][row, p_width:].tolist() == out["response_mask"][row].tolist()
