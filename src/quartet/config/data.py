"""Where prompts come from and how long prompts and responses may be."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from quartet.config.errors import require
from quartet.config.reasoning_gym import ReasoningGymConfig

__all__ = ["ArithmeticOp", "BuiltinTask", "DataConfig", "OverlongPrompt"]


class BuiltinTask(StrEnum):
    """Generated, verifiable tasks that need no download."""

    ARITHMETIC = "arithmetic"
    COUNTDOWN = "countdown"
    CALCULATOR = "calculator"  # multi-turn: a*b+c with the calculator tool (rollout.multi_turn)
    WORD_PROBLEMS = "word_problems"  # multi-turn: stories solved by a program run with the python tool
    GUESSING = "guessing"  # multi-turn: guess a number against a simulated user (guessing_game)
    COUNTING = "counting"  # long responses: write out a run of 250-500 integers (examples/long_context)
    SHAPES = "shapes"  # vision: count the circles in an 84x84 picture (needs a VLM; docs/vision.md)


class ArithmeticOp(StrEnum):
    """Operations of the built-in arithmetic chat set (by name: `+ - *` are not plain YAML scalars)."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"

    @property
    def symbol(self) -> str:
        """How the operation is written in a problem."""
        return {"add": "+", "sub": "-", "mul": "*"}[self.value]


class OverlongPrompt(StrEnum):
    """What happens to a prompt longer than `data.max_prompt_length` tokens."""

    FILTER = "filter"  # drop the row, count it and report the count
    TRUNCATE = "truncate"  # keep the last max_prompt_length tokens (the question end), count it
    ERROR = "error"  # stop with the file and row


@dataclass(frozen=True)
class DataConfig:
    """Datasets, columns and length limits."""

    train_files: tuple[str, ...] = ()
    """Parquet/JSONL files or `datasets` folders for training. Empty: use `builtin_task`."""

    val_files: tuple[str, ...] = ()
    """Held-out files for validation. Empty with `train_files` empty: the built-in task's validation split."""

    builtin_task: BuiltinTask = BuiltinTask.ARITHMETIC
    """Generated task used when `train_files` is empty."""

    builtin_train_size: int = 2048
    """Number of training rows the built-in task generates."""

    builtin_val_size: int = 128
    """Number of validation rows the built-in task generates."""

    builtin_digits: int = 1
    """Built-in arithmetic: digits of each operand (1: operands 0..9, 2: 0..99, ...)."""

    builtin_operations: tuple[ArithmeticOp, ...] = (ArithmeticOp.ADD, ArithmeticOp.SUB, ArithmeticOp.MUL)
    """Built-in arithmetic: operations drawn from (uniformly): any of `add`, `sub`, `mul`."""

    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)
    """reasoning-gym tasks as the prompts, instead of `builtin_task` (when `train_files` is empty and
    `reasoning_gym.tasks` is not); docs/environments.md."""

    prompt_key: str = "prompt"
    """Column holding the chat messages of the prompt (a list of {role, content})."""

    data_source_key: str = "data_source"
    """Column naming the source of each row; it selects the rule scorer."""

    ground_truth_key: str = "reward_model.ground_truth"
    """Dotted path of the reference answer inside a row (verl layout)."""

    image_key: str = "images"
    """Column holding each row's list of images (vision-language models; docs/vision.md): Image-feature
    dicts {bytes, path}, encoded bytes, or paths relative to the data file's folder, one per `<image>`
    placeholder of the prompt. verl's `data.image_key`."""

    min_pixels: int = 0
    """Vision-language models: the smallest image, in pixels, the image processor resizes to (Qwen2-VL's
    `min_pixels`). 0: the processor's own (its `preprocessor_config.json`)."""

    max_pixels: int = 0
    """Vision-language models: the largest image, in pixels, the image processor resizes to (Qwen2-VL's
    `max_pixels`; an image costs pixels / (14 * 14 * 4) prompt tokens). 0: the processor's own."""

    max_prompt_length: int = 64
    """Longest prompt, in tokens after the chat template (an image counts its tokens)."""

    max_response_length: int = 32
    """Longest response, in tokens, for the whole trajectory (all assistant turns and observations)."""

    overlong_prompt: OverlongPrompt = OverlongPrompt.FILTER
    """What to do with prompts longer than `max_prompt_length`."""

    skip_bad_rows: bool = False
    """Skip malformed rows (bad columns, invalid JSON or UTF-8, a prompt message without text or of an
    unknown role, a prompt of only system messages, a data_source no rule scorer knows) instead of stopping
    at the first one; each is counted, and named in `<run dir>/bad_rows.jsonl`."""

    train_batch_size: int = 8
    """Prompts per training step, global (each is sampled `rollout.n` times)."""

    val_batch_size: int = 64
    """Prompts per validation generation call, global."""

    shuffle: bool = True
    """Shuffle the training rows each epoch (with `seed`)."""

    seed: int = 0
    """Seed of the data sampler; its position is saved in checkpoints."""

    def __post_init__(self) -> None:
        require(self.max_prompt_length > 0, "max_prompt_length", "must be > 0", "set a positive token count")
        require(
            self.max_response_length > 0,
            "max_response_length",
            "must be > 0 (nothing would be generated)",
            "set a positive token count, e.g. data.max_response_length=256",
        )
        require(
            self.train_batch_size > 0, "train_batch_size", "must be > 0", "set a positive number of prompts"
        )
        require(self.val_batch_size > 0, "val_batch_size", "must be > 0", "set a positive number of prompts")
        require(self.builtin_train_size > 0, "builtin_train_size", "must be > 0")
        require(self.builtin_val_size > 0, "builtin_val_size", "must be > 0")
        require(
            1 <= self.builtin_digits <= 6, "builtin_digits", f"must lie in [1, 6], got {self.builtin_digits}"
        )
        require(bool(self.builtin_operations), "builtin_operations", "must not be empty", "e.g. [add]")
        require(
            not (self.train_files and self.reasoning_gym.tasks),
            "reasoning_gym.tasks",
            "is set while data.train_files names files: the run would train on the files only",
            "clear data.train_files to train on the reasoning-gym tasks, or clear data.reasoning_gym.tasks",
        )
        require(bool(self.prompt_key), "prompt_key", "must not be empty", "name the prompt column")
        require(bool(self.image_key), "image_key", "must not be empty", "name the images column")
        require(
            self.min_pixels >= 0, "min_pixels", f"must be >= 0, got {self.min_pixels}", "0: the processor's"
        )
        require(
            self.max_pixels >= 0, "max_pixels", f"must be >= 0, got {self.max_pixels}", "0: the processor's"
        )
        require(
            not (self.min_pixels and self.max_pixels) or self.min_pixels <= self.max_pixels,
            "min_pixels",
            f"{self.min_pixels} is larger than max_pixels {self.max_pixels}",
        )
