"""The LLM-judge reward (a generative reward model): rubric prompts out, verdicts in, scores and counts.

For response i with question q_i (the last user message of its prompt), text y_i and ground truth g_i:

    prompt_i  = rubric with {question} = q_i, {response} = y_i, {ground_truth} = g_i   (judge_prompt)
    reply_i   = the judge's chat completion of prompt_i                          (judge_client: cached)
    v_i       = the verdict of reply_i, in [score_min, score_max], or bad        (judge_prompt.parse_verdict)
    J_i       = (v_i - score_min) / (score_max - score_min)   with `normalize`, else v_i
    J_i       = fallback_score                                 for a bad verdict or a failed request

`RewardComputer` adds weight x J_i to the response's score. Nothing is silently zero: each bad verdict is
counted in `reward/judge_bad_verdicts` (the first `log_bad_verdicts` logged with the raw reply), each failed
request in `reward/judge_request_failures`, and both are handed back as failures naming the response, for
`bad_rows.jsonl`.

Metrics of a call: `reward/judge_bad_verdicts`, `reward/judge_request_failures`, `reward/judge_requests`
(HTTP attempts, retries included), `reward/judge_retries`, `reward/judge_cache_hits`, `reward/judge_time_s`,
and `reward/judge_score/mean` (mean J over the good verdicts, absent when there is none).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quartet.config.reward import JudgeCache, JudgeConfig
from quartet.rewards.judge_client import JudgeClient, ReplyCache
from quartet.rewards.judge_prompt import fill_rubric, load_rubric, parse_verdict

__all__ = [
    "JUDGE_BAD_VERDICTS",
    "JUDGE_CACHE_FILE",
    "JUDGE_REQUEST_FAILURES",
    "JudgeResult",
    "JudgeScorer",
]

logger = logging.getLogger(__name__)

JUDGE_BAD_VERDICTS = "reward/judge_bad_verdicts"
"""Responses whose judge reply held no valid verdict (none, out of range, empty): scored the fallback."""
JUDGE_REQUEST_FAILURES = "reward/judge_request_failures"
"""Responses whose judge request failed after its retries: scored the fallback."""
JUDGE_CACHE_FILE = "judge_cache.jsonl"
"""The judge's reply cache in the run folder (`reward.judge.cache=disk`)."""


@dataclass
class JudgeResult:
    """The judge's scores of one batch, in order, and what went wrong."""

    scores: list[float]
    """J_i (see the module docstring), fallback included."""
    failures: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Position -> (`bad_verdict` or `judge_failed`, why), for the responses that got the fallback."""
    metrics: dict[str, float] = field(default_factory=dict)


class JudgeScorer:
    """Scores responses with the judge of `reward.judge` (a URL, or a local model quartet serves)."""

    def __init__(self, cfg: JudgeConfig, run_dir: Path | None = None) -> None:
        """Read the rubric, start the local judge when `model_path` is set, open the cache.

        run_dir: where `cache=disk` keeps `judge_cache.jsonl` (without one the cache stays in memory).
        """
        if not cfg.enabled:
            raise ValueError("reward.judge: set url or model_path to use a judge")
        self.cfg = cfg
        self.template = load_rubric(cfg)
        api_key = _api_key(cfg.api_key_env)
        self._local: Any = None
        url, model = cfg.url, cfg.model
        if cfg.model_path:
            from quartet.rewards.judge_local import LocalJudge

            self._local = LocalJudge(cfg)
            url = self._local.url
            model = self._local.model
            api_key = self._local.api_key
        cache = None
        if cfg.cache is not JudgeCache.OFF:
            disk = cfg.cache is JudgeCache.DISK and run_dir is not None
            cache = ReplyCache(run_dir / JUDGE_CACHE_FILE if disk and run_dir is not None else None)
        self.client = JudgeClient(
            url,
            model,
            api_key,
            max_concurrency=cfg.max_concurrency,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            retry_backoff_s=cfg.retry_backoff_s,
            max_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
            cache=cache,
        )
        self.bad_verdicts_logged = 0

    def close(self) -> None:
        """Stop the local judge (a remote one is not ours to stop)."""
        if self._local is not None:
            self._local.close()
            self._local = None

    def __enter__(self) -> JudgeScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prompts(self, questions: Sequence[str], responses: Sequence[str], truths: Sequence[Any]) -> list[str]:
        """The judge prompt of each response."""
        return [
            fill_rubric(self.template, q, r, g) for q, r, g in zip(questions, responses, truths, strict=True)
        ]

    def score(self, questions: Sequence[str], responses: Sequence[str], truths: Sequence[Any]) -> JudgeResult:
        """J_i of each response (see the module docstring), with the failures and the call's metrics."""
        start = time.perf_counter()
        replies, stats = self.client.complete_all(self.prompts(questions, responses, truths))
        cfg = self.cfg
        result = JudgeResult([cfg.fallback_score] * len(replies))
        good: list[float] = []
        for i, reply in enumerate(replies):
            if reply.text is None:
                result.failures[i] = ("judge_failed", reply.error)
                continue
            verdict = parse_verdict(reply.text, cfg.score_min, cfg.score_max)
            if verdict.score is None:
                result.failures[i] = ("bad_verdict", verdict.problem)
                self._log_bad_verdict(i, verdict.problem, reply.text)
                continue
            value = verdict.score
            if cfg.normalize:
                value = (value - cfg.score_min) / (cfg.score_max - cfg.score_min)
            result.scores[i] = value
            good.append(value)
        bad = sum(kind == "bad_verdict" for kind, _ in result.failures.values())
        result.metrics = {
            JUDGE_BAD_VERDICTS: float(bad),
            JUDGE_REQUEST_FAILURES: float(len(result.failures) - bad),
            "reward/judge_requests": float(stats.requests),
            "reward/judge_retries": float(stats.retries),
            "reward/judge_cache_hits": float(stats.cache_hits),
            "reward/judge_time_s": time.perf_counter() - start,
        }
        if good:
            result.metrics["reward/judge_score/mean"] = sum(good) / len(good)
        if len(result.failures) > bad:
            first = next(why for kind, why in result.failures.values() if kind == "judge_failed")
            logger.warning(
                "%d judge requests failed (fallback score); first: %s", len(result.failures) - bad, first
            )
        return result

    def _log_bad_verdict(self, position: int, problem: str, reply: str) -> None:
        if self.bad_verdicts_logged >= self.cfg.log_bad_verdicts:
            return
        self.bad_verdicts_logged += 1
        more = " (later ones are only counted in reward/judge_bad_verdicts)"
        last = self.bad_verdicts_logged == self.cfg.log_bad_verdicts
        logger.warning(
            "judge bad verdict on response %d: %s; fallback score %g%s. Raw reply:\n%s",
            position,
            problem,
            self.cfg.fallback_score,
            more if last else "",
            reply[:2000],
        )


def _api_key(env_name: str) -> str | None:
    """The key from the environment variable named by `reward.judge.api_key_env` (None when unnamed)."""
    if not env_name:
        return None
    key = os.environ.get(env_name, "")
    if not key:
        raise ValueError(
            f"reward.judge.api_key_env={env_name}: the environment variable {env_name} is not set or empty; "
            f"export {env_name}=<key> before starting the run"
        )
    return key
