"""A judge that quartet serves itself: the tiny model on the built-in engine behind quartet's
OpenAI-compatible server, on CPU, scored end to end. A barely trained model writes no sensible verdict,
so the plumbing is checked (one request per response, each reply read or named as a bad verdict, the counts
add up), not the scores."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from quartet.config.reward import JudgeConfig
from quartet.rewards.judge import JUDGE_BAD_VERDICTS, JUDGE_REQUEST_FAILURES, JudgeScorer
from quartet.rewards.judge_local import LOCAL_JUDGE_NAME


def test_a_tiny_local_judge_answers_every_response(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = JudgeConfig(model_path=str(tiny_model_dir), max_tokens=6, max_concurrency=4, fallback_score=-3.0)
    responses = ["four", "4", "It is 4.", "five"]
    with caplog.at_level(logging.WARNING, logger="quartet.rewards.judge"), JudgeScorer(cfg) as scorer:
        assert scorer.client.model == LOCAL_JUDGE_NAME and scorer.client.endpoint.startswith(
            "http://127.0.0.1:"
        )
        result = scorer.score(["What is 2+2?"] * 4, responses, ["4"] * 4)
        again = scorer.score(["What is 2+2?"] * 4, responses, ["4"] * 4)
    m = result.metrics
    assert m[JUDGE_REQUEST_FAILURES] == 0.0 and m["reward/judge_requests"] == 4.0  # every request answered
    bad = [i for i, (kind, _) in result.failures.items() if kind == "bad_verdict"]
    assert m[JUDGE_BAD_VERDICTS] == len(bad) == len(result.failures)
    for i, value in enumerate(result.scores):
        assert value == -3.0 if i in bad else 0.0 <= value <= 1.0
    assert sum("bad verdict" in r.getMessage() for r in caplog.records) == min(len(bad), 3)
    assert again.metrics["reward/judge_requests"] == 0.0 and again.scores == result.scores  # cached
    assert scorer._local is None  # noqa: SLF001 - closed with the scorer
