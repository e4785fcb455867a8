"""The visual task: pictures drawn as specified, answers that the pixels confirm, held-out images, the
exact scorer, and its multimodal parquet read back as verl's layout."""

from __future__ import annotations

import hashlib
import io
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image
from shape_pixels import count_kinds

from quartet.config.data import BuiltinTask
from quartet.rewards.rules import select_scorer
from quartet.tasks import TASKS
from quartet.tasks.shapes import KINDS, ShapesSpec, compute_score, split, write_rl_set, write_sft_set


def test_answers_match_the_shapes_counted_from_the_pixels() -> None:
    """Across many drawn pictures the ground truth is the number of connected blobs that fill a circle's
    share of their box; every shape is seen (none merged, none lost)."""
    spec = ShapesSpec(targets=("circle", "square"))
    rng = random.Random(7)
    seen_counts = set()
    for _ in range(150):
        problem = spec.draw(rng)
        kinds = count_kinds(problem.png())
        assert sum(kinds.values()) == len(problem.shapes)
        assert str(kinds[problem.target]) == problem.answer
        assert problem.question == f"<image>How many {problem.target}s are in the image?"
        seen_counts.add(int(problem.answer))
    assert seen_counts == set(range(spec.min_count, spec.max_count + 1))


def test_picture_size_and_mode() -> None:
    problem = ShapesSpec(size=56, grid=2, max_count=3, max_distractors=1).draw(random.Random(0))
    image = Image.open(io.BytesIO(problem.png()))
    assert image.format == "PNG" and image.size == (56, 56) and image.mode == "RGB"


def test_same_seed_same_pictures_other_seed_other_pictures() -> None:
    spec = ShapesSpec()
    a = [p.png() for p in split(spec, 20, 8, seed=3)[1]]
    b = [p.png() for p in split(spec, 20, 8, seed=3)[1]]
    c = [p.png() for p in split(spec, 20, 8, seed=4)[1]]
    assert a == b and a != c


def test_validation_images_never_occur_in_training(tmp_path: Path) -> None:
    train_path, val_path = write_rl_set(tmp_path, ShapesSpec(), 300, 60, seed=1)

    def digests(path: Path) -> list[str]:
        return [hashlib.sha256(r[0]["bytes"]).hexdigest() for r in pq.read_table(path)["images"].to_pylist()]

    train, val = digests(train_path), digests(val_path)
    assert len(set(val)) == 60 and not set(train) & set(val)


def test_rl_parquet_round_trip_in_verl_multimodal_layout(tmp_path: Path) -> None:
    train_path, _ = write_rl_set(tmp_path, ShapesSpec(), 12, 4, seed=0)
    table = pq.read_table(train_path)
    assert str(table.schema.field("images").type) == "list<element: struct<bytes: binary, path: string>>"
    for row in table.to_pylist():
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].count("<image>") == len(row["images"]) == 1
        (image,) = row["images"]
        assert image["path"] is None
        truth = row["reward_model"]["ground_truth"]
        assert str(count_kinds(image["bytes"])[row["extra_info"]["target"]]) == truth
        assert row["extra_info"]["count"] == int(truth) and row["data_source"] == "shapes"


def test_sft_rows_carry_the_image_and_the_answer(tmp_path: Path) -> None:
    paths = write_sft_set(tmp_path, ShapesSpec(), 10, 4, seed=0)
    assert pq.read_table(paths[0]).column_names == ["messages", "images", "ground_truth", "data_source"]
    for row in pq.read_table(paths[1]).to_pylist():
        user, assistant = row["messages"]
        assert user["content"].startswith("<image>") and assistant["content"] == row["ground_truth"]
        assert str(count_kinds(row["images"][0]["bytes"])["circle"]) == row["ground_truth"]


@pytest.mark.parametrize(
    ("response", "score"),
    [("3", 1.0), (" 3.\n", 1.0), ("4", 0.0), ("three", 0.0), ("3 circles", 0.0), ("", 0.0), ("-3", 0.0)],
)
def test_scorer_right_wrong_and_malformed(response: str, score: float) -> None:
    assert compute_score(response, "3") == score
    assert select_scorer("shapes")("shapes", response, "3", None) == score  # what the reward workers call


def test_registered_as_a_builtin_task() -> None:
    task = TASKS[BuiltinTask.SHAPES]
    assert task.data_source == "shapes" and task.compute_score is compute_score
    assert set(KINDS) == {"circle", "square", "triangle"}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"size": 80}, "size"),
        ({"min_count": 4, "max_count": 2}, "min_count"),
        ({"max_count": 7, "max_distractors": 3}, "max_distractors"),
        ({"targets": ("hexagon",)}, "targets"),
        ({"targets": KINDS}, "targets"),
    ],
)
def test_bad_spec_names_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ShapesSpec(**changes)  # type: ignore[arg-type]


def test_the_text_sft_trainer_refuses_the_picture_set() -> None:
    from quartet.config import ConfigError
    from quartet.config.sft import SFTBuiltinConfig

    with pytest.raises(ConfigError, match="task.*pictures"):
        SFTBuiltinConfig(task=BuiltinTask.SHAPES)
