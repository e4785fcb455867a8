"""SFTWorker: the loss is the token-mean NLL of assistant tokens, checked against a plain HF forward."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from quartet.config import QuartetConfig
from quartet.models.loading import load_causal_lm
from quartet.sft.data import SFTExample, collate, tokenize_chat
from quartet.sft.worker import SFTWorker

CHATS = [
    [{"role": "user", "content": "What is 3+4?"}, {"role": "assistant", "content": "7"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 12+30?"},
        {"role": "assistant", "content": "42"},
        {"role": "user", "content": "and minus 2?"},
        {"role": "assistant", "content": "It is 40."},
    ],
    [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello there, user"}],
    [{"role": "user", "content": "What is 9-9?"}, {"role": "assistant", "content": "0"}],
]


def _reference_nll(model_dir: Path, examples: list[SFTExample]) -> tuple[float, int]:
    """Sum of -log p(token) over masked tokens, one unpadded sequence at a time, and their count."""
    model = load_causal_lm(model_dir).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor([ex.prompt_ids + ex.response_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            p = len(ex.prompt_ids)
            for j, keep in enumerate(ex.response_mask):
                if keep:
                    total -= float(logp[p + j - 1, ids[0, p + j]])
                    count += 1
    return total, count


@pytest.fixture
def examples(tokenizer: Any) -> list[SFTExample]:
    return [tokenize_chat(tokenizer, chat) for chat in CHATS]


def test_losses_match_an_unpadded_reference(
    sft_config: Callable[..., QuartetConfig], tiny_model_dir: Path, tokenizer: Any, examples: list[SFTExample]
) -> None:
    batch = collate(examples, tokenizer.pad_token_id)
    nll, count = _reference_nll(tiny_model_dir, examples)
    worker = SFTWorker(sft_config("sft.micro_batch_size_per_device=3"), str(tiny_model_dir), total_steps=2)
    stats = worker.eval_loss(batch)
    assert stats["tokens"] == count == sum(ex.trained_tokens for ex in examples)
    assert stats["nll_sum"] == pytest.approx(nll, rel=1e-5)
    metrics = worker.train_batch(batch)  # the loss of the step is computed before the update
    assert metrics["loss"] == pytest.approx(nll / count, rel=1e-5)
    assert metrics["tokens"] == count and metrics["micro_batches"] == 2


def test_filler_rows_and_micro_batching_do_not_change_the_step(
    sft_config: Callable[..., QuartetConfig], tiny_model_dir: Path, tokenizer: Any, examples: list[SFTExample]
) -> None:
    """One micro-batch of 4 rows == 4 micro-batches of 1 row plus 2 zero-mask filler rows: same loss, same
    gradient norm, same parameters after the step (the loss divides by the global token count). AdamW's
    first step is about lr * sign(grad), so parameters are compared to a small fraction of lr."""
    params = []
    for micro, multiple in ((4, 1), (1, 6)):
        cfg = sft_config(f"sft.micro_batch_size_per_device={micro}")
        worker = SFTWorker(cfg, str(tiny_model_dir), total_steps=1)
        batch = collate(examples, tokenizer.pad_token_id, multiple_of=multiple)
        assert len(batch) == (4 if multiple == 1 else 6)
        metrics = worker.train_batch(batch)
        weights = [p.detach().clone() for p in worker.engine.module.parameters()]
        params.append((metrics["loss"], metrics["grad_norm"], weights))
    (loss_a, norm_a, params_a), (loss_b, norm_b, params_b) = params
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    assert norm_a == pytest.approx(norm_b, rel=1e-5)
    lr = sft_config().sft.optim.lr
    for a, b in zip(params_a, params_b, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=lr * 1e-2)


def test_export_writes_a_loadable_folder(
    sft_config: Callable[..., QuartetConfig], tiny_model_dir: Path, tmp_path: Path
) -> None:
    worker = SFTWorker(sft_config(), str(tiny_model_dir))
    out = worker.export_hf(str(tmp_path / "hf"))
    assert out == str(tmp_path / "hf")
    model = load_causal_lm(out)
    ref = worker.engine.module.state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, ref[name])
