"""The vision demo's SFT loop (`quartet.demo.vision_sft`): content parts, image-pad expansion, the padded
batches, the loop's budget and progress records, the scoring rule; with the tiny Qwen2-VL, its prompts equal
the ones GRPO trains on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

from quartet.demo import demo_config
from quartet.demo.vision_sft import (
    Example,
    VisionChat,
    collate,
    expand_pads,
    image_parts,
    row_example,
    score_answers,
    sft,
)
from quartet.tasks.shapes import ShapesSpec, verify_answer, write_rl_set, write_sft_set


def test_image_parts_and_pad_expansion() -> None:
    assert image_parts("<image>How many?") == [{"type": "image"}, {"type": "text", "text": "How many?"}]
    assert image_parts("a<image>b<image>") == [
        {"type": "text", "text": "a"},
        {"type": "image"},
        {"type": "text", "text": "b"},
        {"type": "image"},
    ]
    assert expand_pads([1, 9, 2, 9], 9, [2, 3]) == [1, 9, 9, 2, 9, 9, 9]
    with pytest.raises(ValueError, match="2 images but 1"):
        expand_pads([1, 9], 9, [2, 2])


def test_collate_pads_and_labels_the_answers_only() -> None:
    a = Example([5, 9, 9, 6], [7, 2], torch.ones(4, 3), torch.tensor([[1, 2, 2]]))
    b = Example([5, 9, 6], [8, 2], torch.zeros(4, 3), torch.tensor([[1, 2, 2]]))
    right = collate([a, b], 0, 9, left=False)
    assert right["input_ids"].tolist() == [[5, 9, 9, 6, 7, 2], [5, 9, 6, 8, 2, 0]]
    assert right["labels"].tolist() == [[-100] * 4 + [7, 2], [-100] * 3 + [8, 2, -100]]
    assert right["mm_token_type_ids"].tolist() == [[0, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0]]
    left = collate([a, b], 0, 9, left=True)
    assert left["input_ids"][1].tolist() == [0, 5, 9, 6, 8, 2] and left["attention_mask"][1, 0] == 0
    assert left["pixel_values"].shape == (8, 3) and left["image_grid_thw"].shape == (2, 3)


def test_answers_are_scored_by_the_task_rule() -> None:
    rows = [{"data_source": "shapes", "reward_model": {"ground_truth": str(n)}} for n in (3, 2, 4, 1)]
    texts = ["3", " 2\n", "four", "1 2"]
    assert score_answers(rows, texts) == [
        verify_answer(t, str(n)) for t, n in zip(texts, (3, 2, 4, 1), strict=True)
    ]
    assert score_answers(rows, texts)[:3] == [True, True, False]  # the rule accepts a bare count only
    with pytest.raises(ValueError, match="no built-in scorer"):
        score_answers([{"data_source": "nope", "ground_truth": "1"}], ["1"])


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vision demo's tiny Qwen2-VL, as the demo builds it."""
    from quartet.models.tiny_vision import save_tiny_vlm

    return save_tiny_vlm(tmp_path_factory.mktemp("vlm"), demo_config([], 0, False, "vision").model.tiny)


def _rows(path: Path) -> list[dict[str, Any]]:
    return list(pq.read_table(path).to_pylist())


def test_the_loop_keeps_its_step_budget_and_reports_progress(chat_dir: Path, tmp_path: Path) -> None:
    train, _ = write_sft_set(tmp_path, ShapesSpec(), 6, 2, seed=0)
    chat = VisionChat.load(chat_dir)
    before = [p.detach().clone() for p in chat.model.parameters()]
    records: list[dict[str, Any]] = []
    seconds, steps = sft(
        chat, _rows(train), steps=5, batch_size=4, seed=1, on_record=records.append, log_every=2
    )
    # 6 rows in batches of 4: one full batch per pass, so 5 steps take 5 passes; a record every 2 steps
    assert steps == 5 and seconds > 0 and not chat.model.training
    assert [(r["kind"], r["step"], r["epoch"]) for r in records] == [("train", 2, 2), ("train", 4, 4)]
    assert all(r["loss"] > 0 and r["train_s"] <= seconds for r in records)
    after = list(chat.model.parameters())
    assert all(not torch.equal(a, b) for a, b in zip(before, after, strict=True) if b.requires_grad)
    with pytest.raises(ValueError, match="number of steps or a time budget"):
        sft(chat, _rows(train))


def test_sft_prompts_are_the_prompts_grpo_trains_on(chat_dir: Path, tmp_path: Path) -> None:
    """The SFT loop's prompt tokens (images expanded) equal those of quartet's prompt loader for RL."""
    from quartet.data.images import ImageInputs
    from quartet.data.prompts import PromptDataset
    from quartet.models.loading import load_image_processor

    train, _ = write_rl_set(tmp_path / "data", ShapesSpec(), 4, 2, seed=0)
    chat = VisionChat.load(chat_dir)
    cfg = demo_config([f"data.train_files=[{train}]"], 0, False, "vision")
    images = ImageInputs.of(load_image_processor(chat_dir), chat.tokenizer)
    data = PromptDataset.from_files([str(train)], cfg.data, chat.tokenizer, images=images)
    batch = data.batch(list(range(4)))
    for i, row in enumerate(_rows(train)):
        ids = batch["prompts"][i][batch["attention_mask"][i] != 0].tolist()
        assert row_example(chat, row, with_answer=False).prompt == ids
        assert len(ids) <= cfg.data.max_prompt_length


def test_the_start_stops_at_the_first_step_under_its_stopping_loss(chat_dir: Path, tmp_path: Path) -> None:
    train, _ = write_sft_set(tmp_path, ShapesSpec(), 4, 2, seed=0)
    rows = _rows(train)
    records: list[dict[str, Any]] = []
    chat = VisionChat.load(chat_dir)
    sft(chat, rows, steps=4, batch_size=4, seed=1, on_record=records.append, log_every=1)
    losses = [r["loss"] for r in records]
    # the same start and seed replay the same losses: a threshold just above the third loss (and above
    # none before it) stops the loop right there; 0 turns the stop off
    assert len(losses) == 4 and all(x > 0 for x in losses)
    bar = losses[2] * 1.0001
    want = next(i + 1 for i, x in enumerate(losses) if x < bar)
    _, steps = sft(VisionChat.load(chat_dir), rows, steps=4, batch_size=4, seed=1, stop_loss=bar)
    assert steps == want <= 3
    _, steps = sft(VisionChat.load(chat_dir), rows, steps=4, batch_size=4, seed=1, stop_loss=0.0)
    assert steps == 4
