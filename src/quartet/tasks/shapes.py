"""Shapes: a picture of a few shapes and `How many circles are in the image?` -> `3`. The visual task.

Why it exists: vision-language RL needs a task that a tiny VLM trained from scratch on a CPU can learn
(SFT warm start, then GRPO) and that an exact rule can grade. Every image is an 84x84 white square cut
into a 3x3 grid of 28-pixel cells, 28 pixels being the side of one merged patch of a Qwen2-VL vision
tower (14-pixel patches, 2x2 merge): each shape sits inside one cell (jittered a few pixels), so one image
token sees at most one shape, and counting is adding up what the nine tokens say. 1-5 shapes of the asked
kind are drawn among 0-3 distractors of the other kinds, each filled with a colour from a small palette
(the colour says nothing about the kind). The answer is the count, a bare integer, graded exactly.

Rows follow verl's multimodal layout: the prompt's user message opens with the `<image>` placeholder, the
`images` column holds the row's list of images as `{"bytes": <PNG>, "path": None}` (what Hugging Face
`datasets` writes for an `Image` feature), and `reward_model.ground_truth` is the count. The chat set for
the SFT warm start has the same `images` column next to `messages`. Everything is a deterministic function
of (spec, sizes, seed): the layouts come from `random.Random(seed)` and Pillow draws without anti-aliasing.
Validation layouts never occur in training (`distinct_split` keyed by the whole layout), so validation
accuracy is measured on images the model has not seen.
"""

from __future__ import annotations

import io
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quartet.tasks.rows import CHAT_FILES, RL_FILES, rl_row, sft_row
from quartet.tasks.splits import distinct_split

__all__ = [
    "DATA_SOURCE",
    "IMAGE_PLACEHOLDER",
    "KINDS",
    "PALETTE",
    "Shape",
    "ShapesProblem",
    "ShapesSpec",
    "compute_score",
    "rl_rows",
    "sft_rows",
    "split",
    "verify_answer",
    "write_rl_set",
    "write_rows",
    "write_sft_set",
]

DATA_SOURCE = "shapes"
IMAGE_PLACEHOLDER = "<image>"
"""Where the image goes in a message's text (verl's and Qwen2-VL's convention)."""
KINDS = ("circle", "square", "triangle")
PALETTE = ((220, 50, 47), (38, 139, 210), (133, 153, 0), (211, 54, 130), (108, 113, 196))
"""Fill colours (RGB); the background is white. Any colour goes with any kind."""
_INTEGER = re.compile(r"^\d+$")


@dataclass(frozen=True)
class ShapesSpec:
    """Which pictures the task draws: image size, grid, how many shapes of the asked kind and others."""

    size: int = 84
    """Side of the square image, pixels."""

    grid: int = 3
    """Cells per side; each shape sits in its own cell (84 / 3 = 28 pixels: one merged Qwen2-VL patch)."""

    min_count: int = 1
    """Fewest shapes of the asked kind (the answer's lowest value)."""

    max_count: int = 5
    """Most shapes of the asked kind (inclusive)."""

    max_distractors: int = 3
    """Most shapes of the other kinds (0 to this many, uniformly)."""

    targets: tuple[str, ...] = ("circle",)
    """Kinds a question may ask about (uniformly); the distractors are of the other kinds."""

    def __post_init__(self) -> None:
        if self.grid < 1 or self.size % self.grid or self.size // self.grid < 12:
            raise ValueError(
                f"size must be a multiple of grid with cells of >= 12 pixels, got size={self.size}, "
                f"grid={self.grid}"
            )
        if not 0 <= self.min_count <= self.max_count:
            raise ValueError(f"need 0 <= min_count <= max_count, got {self.min_count}, {self.max_count}")
        if self.max_distractors < 0 or self.max_count + self.max_distractors > self.grid**2:
            raise ValueError(
                f"max_count + max_distractors ({self.max_count} + {self.max_distractors}) must fit the "
                f"{self.grid**2} cells; lower them or raise grid"
            )
        if not self.targets or any(t not in KINDS for t in self.targets) or len(set(self.targets)) == 3:
            raise ValueError(
                f"targets must be a non-empty subset of {KINDS} leaving a kind for distractors, "
                f"got {self.targets}"
            )

    @property
    def cell(self) -> int:
        """Side of one cell, pixels."""
        return self.size // self.grid

    def draw(self, rng: random.Random) -> ShapesProblem:
        """One picture: the asked kind, its count, the distractors, their cells, colours and jitter."""
        target = rng.choice(self.targets)
        count = rng.randint(self.min_count, self.max_count)
        cells = rng.sample(range(self.grid**2), count + rng.randint(0, self.max_distractors))
        others = [k for k in KINDS if k != target]
        jitter = max(0, self.cell // 2 - _radius(self.cell) - 2)
        shapes = []
        for i, cell in enumerate(cells):
            kind = target if i < count else rng.choice(others)
            dx, dy = rng.randint(-jitter, jitter), rng.randint(-jitter, jitter)
            shapes.append(Shape(cell, kind, rng.randrange(len(PALETTE)), dx, dy))
        return ShapesProblem(self.size, self.grid, target, tuple(sorted(shapes, key=lambda s: s.cell)))


@dataclass(frozen=True)
class Shape:
    """One filled shape: its cell (row-major), kind, palette index and offset from the cell's centre."""

    cell: int
    kind: str
    color: int
    dx: int
    dy: int


@dataclass(frozen=True)
class ShapesProblem:
    """One picture and its question."""

    size: int
    grid: int
    target: str
    shapes: tuple[Shape, ...]

    @property
    def question(self) -> str:
        """The user's message (the image placeholder first)."""
        return f"{IMAGE_PLACEHOLDER}How many {self.target}s are in the image?"

    @property
    def count(self) -> int:
        return sum(s.kind == self.target for s in self.shapes)

    @property
    def answer(self) -> str:
        """The ground truth: the count, as a bare integer."""
        return str(self.count)

    def image(self) -> Any:
        """The picture as a Pillow RGB image."""
        from PIL import Image, ImageDraw

        picture = Image.new("RGB", (self.size, self.size), (255, 255, 255))
        pen = ImageDraw.Draw(picture)
        cell = self.size // self.grid
        r = _radius(cell)
        for s in self.shapes:
            row, col = divmod(s.cell, self.grid)
            x, y = col * cell + cell // 2 + s.dx, row * cell + cell // 2 + s.dy
            fill = PALETTE[s.color]
            if s.kind == "circle":
                pen.ellipse((x - r, y - r, x + r, y + r), fill=fill)
            elif s.kind == "square":
                h = round(r * 0.85)  # about the circle's area, so size does not give the kind away
                pen.rectangle((x - h, y - h, x + h, y + h), fill=fill)
            else:
                pen.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
        return picture

    def png(self) -> bytes:
        """The picture as PNG bytes (the same bytes for the same problem)."""
        buffer = io.BytesIO()
        self.image().save(buffer, format="PNG")
        return buffer.getvalue()


def _radius(cell: int) -> int:
    """Half the extent of a shape in a cell of `cell` pixels (room for a margin and some jitter)."""
    return max(4, round(cell * 0.32))


def verify_answer(response: str, ground_truth: str) -> bool:
    """True when the response, stripped (a final `.` allowed), is exactly the integer `ground_truth`."""
    answer = response.strip().removesuffix(".").strip()
    return bool(_INTEGER.match(answer)) and int(answer) == int(ground_truth)


def compute_score(solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """1.0 for the right count, else 0.0 (a malformed answer too); verl's reward-function form."""
    return 1.0 if verify_answer(solution_str, str(ground_truth)) else 0.0


def split(
    spec: ShapesSpec, train_size: int, val_size: int, seed: int
) -> tuple[list[ShapesProblem], list[ShapesProblem]]:
    """(train, val): no validation layout (kinds, cells, colours, offsets) occurs in training."""
    return distinct_split(spec.draw, lambda p: p, train_size, val_size, seed)


def _image_cell(problem: ShapesProblem) -> list[dict[str, Any]]:
    return [{"bytes": problem.png(), "path": None}]


def _extra(problem: ShapesProblem) -> dict[str, Any]:
    return {"target": problem.target, "count": problem.count, "shapes": len(problem.shapes)}


def rl_rows(problems: Iterable[ShapesProblem], split_name: str) -> list[dict[str, Any]]:
    """Rows of the RL prompt set in verl's multimodal layout (`images` last)."""
    rows = []
    for i, p in enumerate(problems):
        row = rl_row(
            [{"role": "user", "content": p.question}],
            DATA_SOURCE,
            p.answer,
            index=i,
            split=split_name,
            ability="vision",
            extra=_extra(p),
        )
        rows.append({**row, "images": _image_cell(p)})
    return rows


def sft_rows(problems: Iterable[ShapesProblem]) -> list[dict[str, Any]]:
    """Rows of the chat set: `messages`, `images`, `ground_truth`, `data_source`."""
    rows = []
    for p in problems:
        messages = [{"role": "user", "content": p.question}, {"role": "assistant", "content": p.answer}]
        row = sft_row(messages, p.answer, DATA_SOURCE)
        rows.append({"messages": row.pop("messages"), "images": _image_cell(p), **row})
    return rows


def write_rows(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows with an `images` column as parquet, the column typed `list<struct<bytes: binary, path:
    string>>` (as `datasets` types an image list) even where every `path` is None; the file's path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image_type = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    names = list(rows[0]) if rows else ["images"]
    rest = pa.Table.from_pylist([{k: v for k, v in r.items() if k != "images"} for r in rows])
    images = pa.array([r["images"] for r in rows], type=image_type)
    columns = {name: images if name == "images" else rest[name] for name in names}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def _write(folder: str | Path, names: tuple[str, str], train: list[Any], val: list[Any]) -> tuple[Path, Path]:
    folder = Path(folder)
    return write_rows(train, folder / names[0]), write_rows(val, folder / names[1])


def write_rl_set(
    folder: str | Path, spec: ShapesSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """Write `rl_train.parquet` and `rl_val.parquet` (verl's multimodal layout; held-out images)."""
    train, val = split(spec, train_size, val_size, seed)
    return _write(folder, RL_FILES, rl_rows(train, "train"), rl_rows(val, "val"))


def write_sft_set(
    folder: str | Path, spec: ShapesSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """Write `train.parquet` and `val.parquet` of the chat set (with its `images` column); their paths."""
    train, val = split(spec, train_size, val_size, seed)
    return _write(folder, CHAT_FILES, sft_rows(train), sft_rows(val))
