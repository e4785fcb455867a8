"""The vision benchmark's harness (benchmarks/vision.py, vision_sft.py): the verdict and summary over seeds,
the table and the plot, the SFT batches; with the vision kit present (quartet.models.tiny_vision), the SFT
loop's prompts equal the ones GRPO trains on, and its config loads."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from vision import CONTROL, GRPO, START, markdown_table, plot_seeds, summarise, verdict
from vision_sft import Example, collate, expand_pads, image_parts

ROOT = Path(__file__).resolve().parents[2]


def _seed(seed: int, start: int, grpo: int, control: int, total: int = 200) -> dict[str, Any]:
    rows = {
        name: {"accuracy": c / total, "correct": c, "total": total, "train_s": 10.0 + seed}
        for name, c in ((START, start), (GRPO, grpo), (CONTROL, control))
    }
    return verdict(seed, rows) | {"wall_s": 100.0 * (seed + 1)}


def test_verdict_and_summary_follow_the_binomial_standard_error() -> None:
    win, tie = _seed(0, 80, 150, 100), _seed(1, 80, 104, 100)
    se = math.sqrt(0.75 * 0.25 / 200 + 0.5 * 0.5 / 200)
    assert win["grpo_minus_control"] == pytest.approx(0.25) and win["difference_se"] == pytest.approx(se)
    assert win["wins"] and win["improves"] and not tie["wins"] and tie["improves"]
    summary = summarise([win, tie])
    assert summary["wins"] == 1 and summary["improves"] == 2 and summary["seeds"] == 2
    assert summary["accuracy_mean"][GRPO] == pytest.approx((0.75 + 0.52) / 2)
    assert summary["wall_s_mean"] == pytest.approx(150.0)


def test_markdown_table_has_a_row_per_seed() -> None:
    table = markdown_table([_seed(0, 80, 150, 100), _seed(2, 10, 20, 30)]).splitlines()
    assert table[0].startswith("| seed | SFT start | GRPO | more SFT (control) | GRPO - control |")
    assert table[2].split(" | ")[:6] == ["| 0", "40.0%", "75.0%", "50.0%", "+25.0%", "4.7%"]
    assert table[3].split(" | ")[4] == "-5.0%" and table[3].endswith("| no | 12 | 300 |")


def test_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = plot_seeds([_seed(0, 80, 150, 100), _seed(1, 60, 90, 70)], tmp_path / "v.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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


def test_sft_prompts_are_the_prompts_grpo_trains_on(tmp_path: Path) -> None:
    """The SFT loop's prompt tokens (images expanded) equal those of quartet's prompt loader for RL."""
    pytest.importorskip("quartet.models.tiny_vision")
    import pyarrow.parquet as pq
    from vision import build_model
    from vision_sft import VisionChat, row_example

    from quartet.config import load_config
    from quartet.data import images as image_inputs  # the vision core's (issue 40)
    from quartet.data.prompts import PromptDataset
    from quartet.models.loading import load_image_processor
    from quartet.tasks.shapes import ShapesSpec, write_rl_set

    train, _ = write_rl_set(tmp_path / "data", ShapesSpec(), 4, 2, seed=0)
    chat = VisionChat.load(build_model(tmp_path / "model", seed=0))
    cfg = load_config(str(ROOT / "examples" / "vision" / "grpo.yaml"), [f"data.train_files=[{train}]"])
    images = image_inputs.ImageInputs.of(load_image_processor(tmp_path / "model"), chat.tokenizer)
    data = PromptDataset.from_files([str(train)], cfg.data, chat.tokenizer, images=images)
    batch = data.batch(list(range(4)))
    for i, row in enumerate(pq.read_table(train).to_pylist()):
        ids = batch["prompts"][i][batch["attention_mask"][i] != 0].tolist()
        assert row_example(chat, row, with_answer=False).prompt == ids
        assert len(ids) <= cfg.data.max_prompt_length
