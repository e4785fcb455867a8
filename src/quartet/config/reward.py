"""How responses are scored."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from quartet.config.errors import ConfigError, require

__all__ = ["JUDGE_FIELDS", "JudgeCache", "JudgeConfig", "RewardConfig", "RuleMode", "check_rubric"]

JUDGE_FIELDS = ("question", "response", "ground_truth")
"""The placeholders a judge rubric may hold, written `{question}`, `{response}`, `{ground_truth}`."""


class RuleMode(StrEnum):
    """How the built-in rule scorers judge GSM8K answers."""

    VERL = "verl"  # verl 0.9.1's gsm8k and Hendrycks-style MATH rules (string comparisons after verl's norm)
    LENIENT = "lenient"  # quartet's rules: whole response, `####42` accepted, numbers compared by value


class JudgeCache(StrEnum):
    """Where the judge's replies are remembered (same prompt and model: same reply, no second request)."""

    OFF = "off"
    MEMORY = "memory"  # for the life of the run's process
    DISK = "disk"  # also appended to <run dir>/judge_cache.jsonl, read back by a resumed run


@dataclass(frozen=True)
class JudgeConfig:
    """An LLM judge (a generative reward model): a rubric prompt per response, a score read from the reply.

    The judge is on when `url` or `model_path` is set. Its score (normalised to [0, 1] unless `normalize`
    is false) times `weight` is added to the response's score (see docs/rewards.md)."""

    url: str = ""
    """Base URL of an OpenAI-compatible server (`http://host:port/v1`); requests go to its
    `/chat/completions`. Empty: no remote judge."""

    model: str = ""
    """Model name sent in each request (required with `url`; with `model_path`: the served name, default
    `judge`)."""

    model_path: str = ""
    """Local folder of a causal LM served as the judge by quartet's built-in engine and OpenAI-compatible
    server, in the driver process, on `device`. Empty: no local judge."""

    device: str = "cpu"
    """Device of the local judge (`model_path`): `cpu`, `cuda` or `cuda:N` (a GPU the driver sees)."""

    api_key_env: str = ""
    """Name of the environment variable holding the API key sent as a bearer token (never the key itself:
    config files are logged and copied into the run folder). Empty: no key."""

    rubric: str = ""
    """The judge prompt template; `{question}`, `{response}` (required) and `{ground_truth}` are replaced,
    other braces are kept. Empty (and no `rubric_file`): the default 0-10 rubric."""

    rubric_file: str = ""
    """A file holding the rubric template (instead of `rubric`)."""

    score_min: float = 0.0
    """Lowest score the rubric allows; a verdict below it is a bad verdict."""

    score_max: float = 10.0
    """Highest score the rubric allows; a verdict above it is a bad verdict."""

    normalize: bool = True
    """Map a verdict s to (s - score_min) / (score_max - score_min), in [0, 1]."""

    weight: float = 1.0
    """Factor of the judge's (normalised) score in the response's total score."""

    fallback_score: float = 0.0
    """Score (before `weight`, on the normalised scale when `normalize`) of a response whose verdict is
    bad (counted in `reward/judge_bad_verdicts`) or whose request failed (`reward/judge_request_failures`)."""

    max_tokens: int = 512
    """Most tokens the judge may write per verdict."""

    temperature: float = 0.0
    """Sampling temperature of the judge (0: greedy, so the cache returns what a new request would)."""

    max_concurrency: int = 8
    """Most judge requests in flight at once."""

    timeout_s: float = 60.0
    """Time limit of one judge request (one attempt); past it the attempt counts as failed and is retried."""

    max_retries: int = 3
    """Retries of a request after a connection error, a timeout, a 429 or a 5xx answer (0: none); other
    4xx answers are not retried."""

    retry_backoff_s: float = 0.5
    """Wait before the first retry, doubled before each next one (capped at 30 s)."""

    cache: JudgeCache = JudgeCache.MEMORY
    """`memory`, `disk` (also `<run dir>/judge_cache.jsonl`) or `off`; keyed by a hash of the model and
    the judge prompt (and the sampling settings)."""

    log_bad_verdicts: int = 3
    """How many bad verdicts are logged with the judge's raw reply (the rest are only counted)."""

    @property
    def enabled(self) -> bool:
        """Whether a judge scores responses."""
        return bool(self.url or self.model_path)

    def __post_init__(self) -> None:
        require(
            not self.url or self.url.startswith(("http://", "https://")),
            "url",
            f"{self.url!r} is not an http(s) URL",
            "write the server's base URL, e.g. http://localhost:8000/v1",
        )
        require(
            not self.api_key_env or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env) is not None,
            "api_key_env",
            f"{self.api_key_env[:4]}... is not an environment variable name",
            "put the key in an environment variable and write that variable's NAME here, e.g. JUDGE_API_KEY",
        )
        if self.rubric:
            check_rubric(self.rubric, "rubric")
        require(self.score_max > self.score_min, "score_max", "must be greater than score_min")
        require(self.max_tokens >= 1, "max_tokens", "must be >= 1")
        require(self.temperature >= 0, "temperature", "must be >= 0")
        require(self.max_concurrency >= 1, "max_concurrency", "must be >= 1")
        require(self.timeout_s > 0, "timeout_s", "must be > 0")
        require(self.max_retries >= 0, "max_retries", "must be >= 0", "use 0 for no retries")
        require(self.retry_backoff_s >= 0, "retry_backoff_s", "must be >= 0")
        require(self.log_bad_verdicts >= 0, "log_bad_verdicts", "must be >= 0")

    def problems(self, prefix: str) -> list[ConfigError]:
        """The rules that tie the judge's keys together (checked by `validate`, after all overrides)."""
        out: list[ConfigError] = []
        if self.url and self.model_path:
            fix = "set url for a judge served elsewhere, or model_path for one quartet serves, not both"
            out.append(ConfigError(f"{prefix}.url", "both url and model_path are set", fix))
        if self.url and not self.model:
            fix = f"set {prefix}.model to the model name the server answers to"
            out.append(ConfigError(f"{prefix}.model", "is empty but url is set", fix))
        if self.rubric and self.rubric_file:
            out.append(ConfigError(f"{prefix}.rubric", "both rubric and rubric_file are set", "keep one"))
        if not self.enabled and (self.rubric or self.rubric_file or self.model):
            fix = (
                f"set {prefix}.url (a server) or {prefix}.model_path (a local model), or drop the judge keys"
            )
            out.append(
                ConfigError(
                    f"{prefix}.url", "judge keys are set but no judge: url and model_path are empty", fix
                )
            )
        return out


def check_rubric(template: str, key: str) -> None:
    """A rubric must ask about the response: `{response}` must be in it."""
    if "{response}" not in template:
        fields = ", ".join("{" + name + "}" for name in JUDGE_FIELDS)
        raise ConfigError(
            key,
            "the rubric has no {response} placeholder, so the judge would never see the response",
            f"write {{response}} where the response goes (placeholders: {fields})",
        )


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

    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """An LLM judge scoring each response with a rubric (off unless `judge.url` or `judge.model_path`)."""

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
