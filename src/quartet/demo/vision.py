"""`quartet demo --task vision`: the SFT start, GRPO and the time-matched control on pictures.

The same experiment as the text demos, on the built-in visual task (`quartet.tasks.shapes`: "How many
circles are in the image?") with a tiny Qwen2-VL the code builds:

1. **Data.** A small fixed chat set of worked answers (`VisionSettings.sft_size`, the scarce
   demonstrations), an RL set of fresh pictures (`data.builtin_train_size`) and held-out pictures in
   neither (`data.builtin_val_size`); all drawn with `data.seed`.
2. **SFT start.** `VisionSettings.sft_steps` supervised steps on the chat set (`vision_sft`: a plain
   transformers loop, because quartet's SFT trainer reads text conversations only).
3. **GRPO** from the SFT start on the RL set: the embedded `vision.yaml` through `RLTrainer`.
4. **Control.** The SFT loop continued from the SFT start for GRPO's training seconds.
5. **Scoring.** Every model answers the held-out pictures greedily, scored by the task's rule; the answers
   are kept in each stage's `answers.jsonl`.

`VisionSettings` is the one place the SFT side of the experiment is written down: the demo and
`benchmarks/vision.py` both run it, so the benchmark's table over seeds is the demo's, seed by seed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quartet.config import QuartetConfig

__all__ = [
    "CONTROL_ROW",
    "GRPO_ROW",
    "QUICK_OVERRIDES",
    "QUICK_SETTINGS",
    "ROWS",
    "SETTINGS",
    "START_ROW",
    "VisionModel",
    "VisionSettings",
    "answers_file",
    "run_vision",
    "split_settings",
    "with_section",
]

Record = dict[str, Any]
START_ROW = "SFT start"
GRPO_ROW = "GRPO"
CONTROL_ROW = "more SFT (control)"
ROWS = (START_ROW, GRPO_ROW, CONTROL_ROW)
"""The table's rows, in order (the text demos' names)."""
ANSWERS_FILE = "answers.jsonl"
PREFIX = "vision."
"""`quartet demo --task vision vision.sft_steps=500`: an override of `VisionSettings`, not of the config."""


@dataclass(frozen=True)
class VisionSettings:
    """The SFT side of the vision experiment: the chat set, the SFT start and the control's loop. (The GRPO
    side, and the RL and held-out set sizes, are the embedded config `vision.yaml`.)"""

    sft_size: int = 32
    """Worked answers in the fixed chat set (the scarce demonstrations)."""
    sft_steps: int = 800
    """Optimizer steps of the SFT start, at most (it stops earlier at `sft_stop_loss`)."""
    sft_batch: int = 32
    """Rows per SFT step (the start and the control)."""
    sft_lr: float = 1e-3
    """AdamW learning rate of the SFT loop (the start and the control)."""
    sft_beta2: float = 0.95
    """AdamW's second-moment decay in the SFT loop (0.999 kept the tiny model at chance for 800+ steps)."""
    sft_stop_loss: float = 0.4
    """The SFT start ends at the first step whose loss is under this (0: run all `sft_steps`): a start that
    has left chance but not memorised its demonstrations, whose answers GRPO can still sample apart."""
    max_distractors: int = 3
    """Squares and triangles among the circles, at most (0: count the coloured cells, the easy version)."""

    def __post_init__(self) -> None:
        for name in ("sft_size", "sft_steps", "sft_batch", "sft_lr", "sft_beta2"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{PREFIX}{name} must be > 0, got {getattr(self, name)}")
        if self.max_distractors < 0:
            raise ValueError(f"{PREFIX}max_distractors must be >= 0, got {self.max_distractors}")


SETTINGS = VisionSettings()
"""The experiment's SFT side (`quartet demo --task vision`, `benchmarks/vision.py`)."""
QUICK_SETTINGS = VisionSettings(sft_size=64, sft_steps=10, sft_batch=16)
"""`--quick` / `--smoke`: the pipeline end to end in a couple of minutes (no meaningful margins)."""
QUICK_OVERRIDES = [
    "cluster.backend=local",  # one process: no Ray start
    "trainer.total_steps=3",
    "trainer.test_freq=0",
    "trainer.rollout_freq=1",  # every step's samples and pictures, for `quartet inspect`
    "data.builtin_train_size=256",
    "data.builtin_val_size=32",
    "data.val_batch_size=32",
]
"""`--quick`'s config overrides of `vision.yaml`."""


def split_settings(overrides: Sequence[str], quick: bool) -> tuple[VisionSettings, list[str]]:
    """The settings (`QUICK_SETTINGS` or `SETTINGS`, with the `vision.<field>=value` overrides applied) and
    the other overrides, for the config. ValueError naming the override when it is not a setting."""
    fields = {f.name: f for f in dataclasses.fields(VisionSettings)}
    changes: dict[str, Any] = {}
    rest = []
    for item in overrides:
        if not item.startswith(PREFIX):
            rest.append(item)
            continue
        key, sep, value = item.removeprefix(PREFIX).partition("=")
        if key in fields and not sep:
            raise ValueError(f"{item!r} has no value: write {item}=<number>")
        if key not in fields:
            known = ", ".join(PREFIX + name for name in fields)
            raise ValueError(
                f"{item!r} is not a vision setting: write {PREFIX}<name>=<value>, names: {known}"
            )
        kind = float if fields[key].type in (float, "float") else int
        try:
            changes[key] = kind(value)
        except ValueError:
            raise ValueError(f"{item!r}: {PREFIX}{key} takes a number ({kind.__name__})") from None
    return dataclasses.replace(QUICK_SETTINGS if quick else SETTINGS, **changes), rest


@dataclass
class VisionModel:
    """One trained model of the experiment and its held-out score."""

    name: str
    model_dir: Path
    train_seconds: float
    steps: int
    correct: int = 0
    total: int = 0


def with_section(cfg: QuartetConfig, section: str, **changes: Any) -> QuartetConfig:
    """`cfg` with the fields `changes` of its `section` (e.g. "trainer") replaced."""
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **changes)})


def prepare_data(folder: Path, cfg: QuartetConfig, s: VisionSettings) -> dict[str, Path]:
    """The chat set and the RL set of `data.seed`, with the SAME held-out pictures (both splits drawn with
    the same seed and validation size); their files."""
    from quartet.tasks.shapes import ShapesSpec, write_rl_set, write_sft_set

    spec = ShapesSpec(max_distractors=s.max_distractors)
    seed = cfg.data.seed
    val = cfg.data.builtin_val_size
    sft_train, sft_val = write_sft_set(folder / "sft", spec, s.sft_size, val, seed)
    rl_train, rl_val = write_rl_set(folder / "rl", spec, cfg.data.builtin_train_size, val, seed)
    return {"sft_train": sft_train, "sft_val": sft_val, "rl_train": rl_train, "rl_val": rl_val}


def _rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return list(pq.read_table(path).to_pylist())


def _start_model(folder: Path, cfg: QuartetConfig) -> Path:
    """`model.path` when given, else the config's tiny Qwen2-VL shape built with `model.tiny.seed`."""
    if cfg.model.path:
        return Path(cfg.model.path)
    from quartet.models import tiny_vision

    return Path(tiny_vision.save_tiny_vlm(folder, cfg.model.tiny))


def _sft_stage(
    name: str, source: Path, folder: Path, rows: list[dict[str, Any]], s: VisionSettings, **budget: Any
) -> VisionModel:
    """The SFT loop from the model in `source` for `budget` (`steps`/`seconds`, `seed`, `on_record`),
    exported to `folder/hf`."""
    from quartet.demo.vision_sft import VisionChat, sft
    from quartet.tracking.run_layout import HF_DIR

    chat = VisionChat.load(source)
    seconds, steps = sft(chat, rows, batch_size=s.sft_batch, lr=s.sft_lr, beta2=s.sft_beta2, **budget)
    hf = chat.save(folder / HF_DIR)
    if budget.get("on_record") is not None:
        budget["on_record"]({"kind": "export", "hf_dir": str(hf)})
    return VisionModel(name, hf, seconds, steps)


def _grpo(
    cfg: QuartetConfig, project: str, start: Path, files: dict[str, Path], emit: Callable[[Record], None]
) -> tuple[VisionModel, Path]:
    """GRPO from the SFT start on the RL set, validated on the held-out pictures; the model and its run."""
    from quartet.config.trainer import Logger
    from quartet.trainer import RLTrainer

    # the caller shows progress (on_record): the console logger would say everything twice
    loggers = tuple(x for x in cfg.trainer.loggers if x is not Logger.CONSOLE)
    rl_cfg = with_section(cfg, "trainer", project_name=project, experiment_name="grpo", loggers=loggers)
    rl_cfg = with_section(rl_cfg, "model", path=str(start))
    data = {"train_files": (str(files["rl_train"]),), "val_files": (str(files["rl_val"]),)}
    rl_cfg = with_section(rl_cfg, "data", **data)
    result = RLTrainer(rl_cfg, on_record=emit).run()
    if result.hf_dir is None:
        raise RuntimeError("the GRPO run exported no model: keep trainer.export_final on")
    return VisionModel(GRPO_ROW, Path(result.hf_dir), result.train_seconds, result.steps), result.run_dir


def answers_file(stage_dir: Path) -> Path:
    """Where a stage's greedy held-out answers are kept: one JSON line per picture (`index`, `answer`,
    `ground_truth`, `correct`)."""
    return stage_dir / ANSWERS_FILE


def _score(model: VisionModel, rows: list[dict[str, Any]], stage_dir: Path, max_new_tokens: int) -> None:
    """The exported model's greedy answers to the held-out `rows`, scored, kept in `answers.jsonl`."""
    from quartet.demo.vision_sft import VisionChat, greedy_answers, score_answers

    texts = greedy_answers(VisionChat.load(model.model_dir), rows, max_new_tokens)
    verdicts = score_answers(rows, texts)
    lines = [
        json.dumps({"index": i, "answer": t, "ground_truth": r["reward_model"]["ground_truth"], "correct": v})
        for i, (r, t, v) in enumerate(zip(rows, texts, verdicts, strict=True))
    ]
    answers_file(stage_dir).write_text("".join(line + "\n" for line in lines))
    model.correct = sum(verdicts)
    model.total = len(rows)


def run_vision(
    cfg: QuartetConfig, s: VisionSettings, project: str, on_record: Callable[[Record], None] | None = None
) -> tuple[list[VisionModel], Path]:
    """The experiment under `trainer.output_dir/project`: data, SFT start, GRPO, the control for GRPO's
    training seconds, each scored on the held-out pictures. Returns the models in `ROWS` order and the GRPO
    run folder (its curves and rollouts, pictures included, for `quartet inspect`)."""
    from quartet.tracking.run_layout import DATA_DIR

    emit = on_record or (lambda rec: None)
    base = Path(cfg.trainer.output_dir) / project
    files = prepare_data(base / DATA_DIR, cfg, s)
    (base / "vision_settings.json").write_text(json.dumps(dataclasses.asdict(s), indent=1) + "\n")
    chat_rows = _rows(files["sft_train"])
    seed = cfg.sft.seed
    random_model = _start_model(base / "random", cfg)
    start = _sft_stage(
        START_ROW,
        random_model,
        base / "sft_start",
        chat_rows,
        s,
        steps=s.sft_steps,
        stop_loss=s.sft_stop_loss,
        seed=seed,
        on_record=emit,
    )
    grpo, grpo_run = _grpo(cfg, project, start.model_dir, files, emit)
    control = _sft_stage(
        CONTROL_ROW,
        start.model_dir,
        base / "sft_control",
        chat_rows,
        s,
        seconds=grpo.train_seconds,
        seed=seed + 1,
        on_record=emit,
    )
    val_rows = _rows(files["rl_val"])
    for model, stage in ((start, base / "sft_start"), (grpo, grpo_run), (control, base / "sft_control")):
        _score(model, val_rows, stage, cfg.data.max_response_length)
    return [start, grpo, control], grpo_run
