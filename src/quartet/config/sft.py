"""Supervised fine-tuning (`quartet sft`): chat data, lengths, batch sizes, optimizer, evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field

from quartet.config.data import ArithmeticOp, BuiltinTask
from quartet.config.errors import require
from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig

__all__ = ["ArithmeticOp", "SFTBuiltinConfig", "SFTConfig"]


_SLOPPY_TASKS = (BuiltinTask.CALCULATOR, BuiltinTask.WORD_PROBLEMS, BuiltinTask.GUESSING)


@dataclass(frozen=True)
class SFTBuiltinConfig:
    """The built-in chat set, generated into the run folder when `sft.train_files` is empty."""

    task: BuiltinTask = BuiltinTask.ARITHMETIC
    """Which built-in task's worked examples: arithmetic, or the multi-turn traces of calculator,
    word_problems (python tool) or guessing (a game against the simulated user)."""

    train_size: int = 1024
    """Conversations (rows) in the generated training split."""

    val_size: int = 20
    """Conversations (rows) in the generated validation split: distinct problems that never occur in
    training (at most half of all problems: 1-digit addition has 100)."""

    digits: int = 1
    """Digits of each operand (1: operands 0..9, 2: 0..99, ...)."""

    operations: tuple[ArithmeticOp, ...] = (ArithmeticOp.ADD,)
    """Operations drawn from (uniformly): any of `add`, `sub`, `mul`."""

    sloppy: float = 0.0
    """The share of SFT traces from a weaker demonstrator, a start for RL to improve on: calculator and
    word_problems, answers from the head without the tool (operands rounded to tens); guessing, games of a
    random (but consistent) guesser instead of the binary-search player. Other tasks: must be 0."""

    worked_answer: bool = False
    """Answer `3+4=7` instead of `7` (the verifier reads the number after the last `=`)."""

    @property
    def symbols(self) -> tuple[str, ...]:
        """The operations as written in problems (`+ - *`)."""
        return tuple(ArithmeticOp(op).symbol for op in self.operations)

    def __post_init__(self) -> None:
        require(self.train_size > 0, "train_size", "must be > 0")
        require(self.val_size > 0, "val_size", "must be > 0")
        require(1 <= self.digits <= 6, "digits", f"must lie in [1, 6], got {self.digits}")
        require(0.0 <= self.sloppy <= 1.0, "sloppy", f"must lie in [0, 1], got {self.sloppy}")
        require(
            self.sloppy == 0.0 or self.task in _SLOPPY_TASKS,
            "sloppy",
            f"has no meaning for the {self.task.value!r} traces (calculator, word_problems and guessing"
            " only); set it to 0",
        )
        require(
            self.task is not BuiltinTask.COUNTDOWN,
            "task",
            f"no built-in SFT set for {self.task.value!r}",
            "use arithmetic, calculator, word_problems or guessing, or give sft.train_files",
        )
        require(
            self.task is not BuiltinTask.SHAPES,
            "task",
            "the shapes chat set holds pictures, which quartet's SFT trainer does not read (it would train "
            "on the text alone)",
            "for a vision-language warm start see `quartet demo --task vision` (quartet.demo.vision_sft, "
            "docs/vision.md)",
        )
        if self.task is not BuiltinTask.ARITHMETIC:
            return
        require(bool(self.operations), "operations", "must not be empty", "e.g. sft.builtin.operations=[add]")
        require(len(set(self.operations)) == len(self.operations), "operations", "lists an operation twice")
        space = 100**self.digits * len(self.operations)
        require(
            2 * self.val_size <= space,
            "val_size",
            f"{self.val_size} distinct held-out problems is more than half of the {space} problems",
            f"use at most {space // 2}, or more digits or operations",
        )


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning on chat conversations; the loss covers assistant-written tokens only."""

    train_files: tuple[str, ...] = ()
    """Parquet or JSONL files of conversations. Empty: the built-in arithmetic set (`sft.builtin`)."""

    val_files: tuple[str, ...] = ()
    """Held-out conversations for validation loss and greedy exact match. Empty with `train_files` empty:
    the built-in set's validation split; empty otherwise: no validation."""

    messages_key: str = "messages"
    """Column of each row holding the conversation: a list of {role, content} messages."""

    tools_key: str = "tools"
    """Column of tool schemas rendered with a row (a list, or its JSON text); absent or null: no tools."""

    max_length: int = 128
    """Longest conversation in tokens (prompt + responses, after the chat template). Longer rows are
    filtered and counted, or cut to this length with `truncate`."""

    truncate: bool = False
    """Cut overlong rows to `max_length` tokens (counted) instead of filtering them out (counted)."""

    skip_bad_rows: bool = False
    """Count and log malformed rows (missing key, wrong type, no assistant turn) instead of stopping."""

    keep_verified: bool = False
    """Train only on conversations whose final answer the task's verifier accepts (rows need `data_source`
    with a built-in verifier and `ground_truth`): rejection-sampled demonstrations. Dropped rows are counted
    in the data report. The validation split is not filtered."""

    builtin: SFTBuiltinConfig = field(default_factory=SFTBuiltinConfig)
    """The generated arithmetic chat set used when `train_files` is empty."""

    batch_size: int = 32
    """Sequences per optimizer step, global (one sequence = one conversation: its prompt and all its
    assistant responses); must divide over `cluster.world_size` devices."""

    micro_batch_size_per_device: int = 32
    """Sequences (conversation prompt + responses) per forward/backward on one device (per device);
    gradients accumulate over micro-batches."""

    epochs: int = 8
    """Passes over the training conversations (8 x 1024 built-in rows: 256 steps, about 10 s on a CPU)."""

    max_steps: int = 0
    """Stop after this many optimizer steps; 0 runs all `epochs`."""

    max_seconds: float = 0.0
    """Stop training once this many seconds of optimizer steps have passed; 0 disables (a time-matched
    control run, like the demo's more-SFT row, sets it)."""

    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-3, weight_decay=0.0))
    """Optimizer and schedule (2e-3 suits the tiny default model; real models want ~1e-5)."""

    mixed_precision: Dtype = Dtype.FLOAT32
    """Autocast dtype of forward/backward (weights stay float32): float32 or bfloat16 (bfloat16 on GPU)."""

    eval_samples: int = 64
    """Held-out conversations answered greedily before and after training (exact match); 0 skips it."""

    eval_max_new_tokens: int = 8
    """Longest greedy answer, in tokens, in the exact-match evaluation."""

    seed: int = 0
    """Seed of the built-in data, the shuffling sampler and the model's fresh parameters."""

    def __post_init__(self) -> None:
        require(bool(self.messages_key), "messages_key", "must not be empty", "name the messages column")
        require(self.max_length > 1, "max_length", f"must be > 1, got {self.max_length}")
        require(self.batch_size > 0, "batch_size", "must be > 0", "set a positive number of sequences")
        require(self.micro_batch_size_per_device > 0, "micro_batch_size_per_device", "must be > 0")
        require(self.epochs > 0, "epochs", "must be > 0")
        require(self.max_steps >= 0, "max_steps", "must be >= 0", "use 0 to run every epoch")
        require(self.eval_samples >= 0, "eval_samples", "must be >= 0", "use 0 to skip the evaluation")
        require(self.eval_max_new_tokens > 0, "eval_max_new_tokens", "must be > 0")
        require(
            self.mixed_precision is not Dtype.FLOAT16,
            "mixed_precision",
            "float16 needs loss scaling, which the engine does not do",
            "use bfloat16 or float32",
        )
        require(
            not self.val_files or bool(self.train_files),
            "val_files",
            "is set while train_files is empty (the built-in set brings its own validation split)",
            "set sft.train_files too, or clear sft.val_files",
        )
