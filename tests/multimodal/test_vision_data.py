"""Multimodal rows at load: images from bytes, Image-feature dicts or paths, prompt lengths that count the
image tokens, bad images named and counted, and the batch's per-row image columns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from vision_cases import image_row, png

from quartet.config.data import DataConfig
from quartet.config.from_verl import translate_overrides
from quartet.data.errors import DataError
from quartet.data.images import ImageInputs
from quartet.data.prompts import PromptDataset
from quartet.models.loading import load_image_processor, load_tokenizer


@pytest.fixture(scope="module")
def parts(tiny_vlm_dir: Path) -> tuple[Any, ImageInputs]:
    tokenizer = load_tokenizer(tiny_vlm_dir)
    return tokenizer, ImageInputs.of(load_image_processor(tiny_vlm_dir), tokenizer)


def _tokens(images: ImageInputs, blob: bytes) -> int:
    """Image tokens of one image, from the processor's own grid (independent of `tokens_per_image`)."""
    grid = images.process([blob])["image_grid_thw"][0]
    return int(grid.prod()) // images.merge_size**2


def _write_jsonl(folder: Path, rows: list[dict[str, Any]]) -> Path:
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_paths_and_expanded_prompt_lengths(tmp_path: Path, parts: tuple[Any, ImageInputs]) -> None:
    tokenizer, images = parts
    wide, small = png("red", (120, 60)), png("blue")
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "wide.png").write_bytes(wide)
    (tmp_path / "pics" / "small.png").write_bytes(small)
    rows = [image_row("<image> then <image>?", ["pics/wide.png", {"path": "pics/small.png"}])]
    data = PromptDataset.from_files(
        [str(_write_jsonl(tmp_path, rows))], DataConfig(max_prompt_length=200), tokenizer, images=images
    )
    ids = data.prompt_ids(0)
    expected = _tokens(images, wide) + _tokens(images, small)
    assert ids.count(images.image_token_id) == expected > 2
    parts = [
        {"type": "image"},
        {"type": "text", "text": " then "},
        {"type": "image"},
        {"type": "text", "text": "?"},
    ]
    one_pad_each = tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert len(ids) == len(one_pad_each) - 2 + expected  # each image's single pad became its tokens
    batch = data.batch([0])
    assert batch.non_tensors["images"][0] == [wide, small]  # the files' bytes, for the inspector
    mm = batch.non_tensors["multi_modal_inputs"][0]
    assert mm["image_grid_thw"].shape == (2, 3)
    assert mm["pixel_values"].shape[0] == int(mm["image_grid_thw"].prod(-1).sum())


def test_prompt_limit_counts_image_tokens(parts: tuple[Any, ImageInputs]) -> None:
    tokenizer, images = parts
    rows = [image_row("<image>hi", [png("red", (112, 112))]), image_row("just text", [])]
    cfg = DataConfig(max_prompt_length=20, overlong_prompt="truncate")  # type: ignore[arg-type]
    data = PromptDataset.from_rows(rows, cfg, tokenizer, "rows.jsonl", images=images)
    assert len(data) == 1 and data.report.filtered_overlong == 1  # 16 image tokens: over 20, never cut


BAD = [
    (image_row("<image>", [b"\x89PNG but not really"]), "bad_image", "images[0]"),
    (image_row("<image>", ["no/such.png"]), "bad_image", "images[0]"),
    (image_row("<image> and <image>", [png("red")]), "image_count_mismatch", "prompt"),
    (image_row("no placeholder", [png("red")]), "image_count_mismatch", "prompt"),
    (image_row("<image>", [{"bytes": None, "path": None}]), "bad_image", "images[0]"),
]


@pytest.mark.parametrize(("row", "reason", "column"), BAD)
def test_a_bad_image_row_is_named(
    parts: tuple[Any, ImageInputs], row: dict[str, Any], reason: str, column: str
) -> None:
    tokenizer, images = parts
    good = image_row("<image>ok", [png("green")])
    with pytest.raises(DataError) as err:
        PromptDataset.from_rows(
            [good, row], DataConfig(max_prompt_length=100), tokenizer, "f.jsonl", images=images
        )
    assert (err.value.file, err.value.row, err.value.column) == ("f.jsonl", 1, column)
    data = PromptDataset.from_rows(
        [good, row],
        DataConfig(max_prompt_length=100, skip_bad_rows=True),
        tokenizer,
        "f.jsonl",
        images=images,
    )
    assert len(data) == 1 and data.report.bad_rows == {reason: 1}
    assert [(b.row, b.reason, b.field) for b in data.report.bad] == [(1, reason, column)]


def test_a_text_model_refuses_image_rows(parts: tuple[Any, ImageInputs]) -> None:
    tokenizer, _ = parts
    cfg = DataConfig(max_prompt_length=100, skip_bad_rows=True)
    rows = [image_row("<image>", [png("red")]), image_row("plain", [])]
    data = PromptDataset.from_rows(rows, cfg, tokenizer, "f.jsonl")
    assert len(data) == 1 and data.report.bad_rows == {"images_need_vision_model": 1}
    assert "images" not in data.batch([0]).non_tensors


def test_verl_multimodal_keys() -> None:
    out = translate_overrides(
        [
            "data.image_key=pics",
            "data.return_multi_modal_inputs=true",
            "data.video_key=videos",
            "actor_rollout_ref.actor.freeze_vision_tower=false",
        ]
    )
    assert out.quartet_values["data.image_key"] == "pics"
    assert out.quartet_values["model.freeze_vision_tower"] is False
    reasons = {u.key: u.reason for u in out.unmapped}
    assert "pixels" in reasons["data.return_multi_modal_inputs"]
    assert "not videos" in reasons["data.video_key"]


def test_pixel_bounds_from_the_config(tiny_vlm_dir: Path) -> None:
    """data.min_pixels / max_pixels reach the image processor: fewer pixels, fewer prompt tokens."""
    from quartet.config import load_config
    from quartet.trainer.feed.rl_data import image_inputs

    tokenizer = load_tokenizer(tiny_vlm_dir)
    plain = image_inputs(load_config(None, []), str(tiny_vlm_dir), tokenizer)
    small = image_inputs(load_config(None, ["data.max_pixels=3136"]), str(tiny_vlm_dir), tokenizer)
    assert plain is not None and small is not None
    assert plain.tokens_per_image(112, 112) == 16 and small.tokens_per_image(112, 112) == 4
    blob = png("red", (112, 112))
    assert int(small.process([blob])["image_grid_thw"].prod()) == 4 * small.merge_size**2


def test_multi_turn_takes_a_vision_model_on_the_built_in_engine(tiny_vlm_dir: Path) -> None:
    """Agent loops carry images on the built-in engine with history kept as tokens; the vLLM engine and
    re-rendered histories are refused, naming the key and the fix."""
    from quartet.config import load_config
    from quartet.trainer.feed.rl_data import image_inputs

    tokenizer = load_tokenizer(tiny_vlm_dir)
    on = ["rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[zoom]"]
    assert image_inputs(load_config(None, on), str(tiny_vlm_dir), tokenizer) is not None
    with pytest.raises(DataError, match="(?s)rollout.engine: vllm.*set rollout.engine: torch"):
        image_inputs(load_config(None, [*on, "rollout.engine=vllm"]), str(tiny_vlm_dir), tokenizer)
    rerender = [*on, "rollout.multi_turn.template_mode=rerender"]
    with pytest.raises(DataError, match="(?s)template_mode: rerender.*keep_history_tokens"):
        image_inputs(load_config(None, rerender), str(tiny_vlm_dir), tokenizer)
