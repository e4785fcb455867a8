"""How responses are scored."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from quartet.config.errors import require

__all__ = ["RewardConfig", "RuleMode"]


class RuleMode(StrEnum):
    """How the built-in rule scorers judge GSM8K answers."""

    VERL = "verl"  # verl 0.9.1's gsm8k and Hendrycks-style MATH rules (string comparisons after verl's norm)
    LENIENT = "lenient"  # quartet's rules: whole response, `####42` accepted, numbers compared by value


@dataclass(frozen=True)
class RewardConfig:
    """Rule scorers (chosen by `data_source`), a custom function, or a reward model."""

    function: str = ""
    """Custom scorer as `path/to/file.py:function` or `package.module:function`. Empty: built-in rules."""

    rule_mode: RuleMode = RuleMode.VERL
    """Built-in GSM8K / MATH rules (no `reward.function`): `verl` gives verl 0.9.1's verdicts (GSM8K: the
    last 300 characters, only `#### <number>` with one space, string equality; MATH sources: verl's
    Hendrycks normalisation of the last box); `lenient` reads the whole response, accepts `####42`,
    `18.0` for `18`, and compares math answers as exact rationals (`rules/registry.py` lists the sources)."""

    model_path: str = ""
    """Folder of a sequence-classification reward model. Empty: no reward model."""

    micro_batch_size_per_device: int = 16
    """Responses per reward-model forward pass on one device (per device, counts responses)."""

    timeout_s: float = 10.0
    """Time limit of one rule or custom score call; a timeout scores 0 and is counted."""

    num_workers: int = 1
    """Processes that run rule scorers in parallel."""

    overlong_buffer: int = 0
    """DAPO soft overlong penalty: tokens before `data.max_response_length` where it ramps up; 0 off."""

    overlong_penalty_factor: float = 1.0
    """Penalty at the maximum length (linear from 0 at the buffer's start)."""

    def __post_init__(self) -> None:
        require(
            not self.function or ":" in self.function,
            "function",
            f"'{self.function}' has no ':'",
            "write it as path/to/file.py:function_name or package.module:function_name",
        )
        require(self.micro_batch_size_per_device > 0, "micro_batch_size_per_device", "must be > 0")
        require(self.timeout_s > 0, "timeout_s", "must be > 0")
        require(self.num_workers >= 1, "num_workers", "must be >= 1")
        require(self.overlong_buffer >= 0, "overlong_buffer", "must be >= 0", "use 0 to disable")
        require(self.overlong_penalty_factor >= 0, "overlong_penalty_factor", "must be >= 0")
