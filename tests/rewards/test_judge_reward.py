"""The LLM judge reward against a fake OpenAI-compatible judge: verdicts, bad verdicts, retries, timeouts,
the cache, the API key and the rubric; then through `RewardComputer` as a run scores."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_judge import SLOW_S, FakeJudge
from test_reward_compute import RESPONSE_LENGTH, expected_token_scores, make_batch

from quartet.config import ConfigError
from quartet.config.reward import JudgeCache, JudgeConfig, RewardConfig
from quartet.rewards import RewardComputer
from quartet.rewards.judge import JUDGE_BAD_VERDICTS, JUDGE_CACHE_FILE, JUDGE_REQUEST_FAILURES, JudgeScorer
from quartet.rewards.judge_prompt import DEFAULT_RUBRIC, fill_rubric

QUESTION = "What is 2+2?"


@pytest.fixture
def fake() -> Iterator[FakeJudge]:
    with FakeJudge() as judge:
        yield judge


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)


def config(url: str, **changes: Any) -> JudgeConfig:
    base: dict[str, Any] = {
        "url": url,
        "model": "fake-judge",
        "timeout_s": 2.0,
        "max_retries": 2,
        "retry_backoff_s": 0.01,
        "fallback_score": -1.0,
    }
    return JudgeConfig(**(base | changes))


def prompt_of(response: str, truth: Any = "4") -> str:
    return fill_rubric(DEFAULT_RUBRIC, QUESTION, response, truth)


def score(scorer: JudgeScorer, responses: list[str]) -> Any:
    return scorer.score([QUESTION] * len(responses), responses, ["4"] * len(responses))


def test_verdicts_are_read_and_bad_ones_get_the_fallback_and_are_counted(
    fake: FakeJudge, caplog: pytest.LogCaptureFixture
) -> None:
    responses = ["GOOD7", "TAG3", "GARBAGE", "HIGH", "FLAKY9", "DEAD", "REJECT"]
    with caplog.at_level(logging.WARNING, logger="quartet.rewards.judge"), JudgeScorer(config(fake.url)) as s:
        result = score(s, responses)
    assert result.scores == pytest.approx([0.7, 0.3, -1.0, -1.0, 0.9, -1.0, -1.0])
    assert {i: kind for i, (kind, _) in result.failures.items()} == {
        2: "bad_verdict",
        3: "bad_verdict",
        5: "judge_failed",
        6: "judge_failed",
    }
    assert "no verdict" in result.failures[2][1] and "outside [0, 10]" in result.failures[3][1]
    assert "HTTP 500" in result.failures[5][1] and "3 attempts" in result.failures[5][1]
    assert "HTTP 400" in result.failures[6][1]
    # server side: FLAKY retried once, DEAD retried max_retries=2 times, REJECT (a 4xx) never
    assert {r: fake.requests[prompt_of(r)] for r in responses} == {
        "GOOD7": 1, "TAG3": 1, "GARBAGE": 1, "HIGH": 1, "FLAKY9": 2, "DEAD": 3, "REJECT": 1
    }  # fmt: skip
    m = result.metrics
    assert (m[JUDGE_BAD_VERDICTS], m[JUDGE_REQUEST_FAILURES]) == (2.0, 2.0)
    assert (m["reward/judge_requests"], m["reward/judge_retries"]) == (fake.total, 3.0)
    assert m["reward/judge_score/mean"] == pytest.approx((0.7 + 0.3 + 0.9) / 3)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "bananas are yellow" in logged and "Score: 42" in logged  # the raw replies of bad verdicts


def test_only_the_first_bad_verdicts_are_logged(fake: FakeJudge, caplog: pytest.LogCaptureFixture) -> None:
    logs = caplog.at_level(logging.WARNING, logger="quartet.rewards.judge")
    with logs, JudgeScorer(config(fake.url, log_bad_verdicts=2)) as s:
        result = score(s, [f"GARBAGE {i}" for i in range(5)])
    assert result.metrics[JUDGE_BAD_VERDICTS] == 5.0
    assert sum("bad verdict" in r.getMessage() for r in caplog.records) == 2


def test_a_slow_attempt_times_out_and_is_retried(fake: FakeJudge) -> None:
    start = time.monotonic()
    with JudgeScorer(config(fake.url, timeout_s=0.5)) as s:
        result = score(s, ["SLOW6"])
    assert result.scores == pytest.approx([0.6]) and fake.requests[prompt_of("SLOW6")] == 2
    assert time.monotonic() - start < SLOW_S  # the client did not wait for the slow answer


def test_without_retries_a_timeout_fails_the_response(fake: FakeJudge) -> None:
    with JudgeScorer(config(fake.url, timeout_s=0.3, max_retries=0, fallback_score=0.25)) as s:
        result = score(s, ["SLOW6", "GOOD2"])
    assert result.scores == pytest.approx([0.25, 0.2])
    assert result.failures[0][0] == "judge_failed" and "timeout_s=0.3" in result.failures[0][1]
    assert fake.requests[prompt_of("SLOW6")] == 1


def test_the_cache_answers_repeated_prompts_without_a_request(fake: FakeJudge) -> None:
    with JudgeScorer(config(fake.url)) as s:
        first = score(s, ["GOOD5", "GOOD5", "GARBAGE", "DEAD"])  # a batch's duplicates are sent once
        sent = fake.total
        second = score(s, ["GOOD5", "GARBAGE"])
        third = score(s, ["DEAD"])  # failures are not cached: asked again
    assert fake.requests[prompt_of("GOOD5")] == 1 and fake.requests[prompt_of("GARBAGE")] == 1
    assert first.metrics["reward/judge_cache_hits"] == 1.0
    assert second.scores == pytest.approx([0.5, -1.0]) and second.metrics[JUDGE_BAD_VERDICTS] == 1.0
    assert second.metrics["reward/judge_requests"] == 0.0 and second.metrics["reward/judge_cache_hits"] == 2.0
    assert third.metrics["reward/judge_requests"] == 3.0 and fake.total == sent + 3


def test_a_disk_cache_is_read_back_by_a_new_scorer(fake: FakeJudge, tmp_path: Path) -> None:
    cfg = config(fake.url, cache=JudgeCache.DISK)
    with JudgeScorer(cfg, run_dir=tmp_path) as s:
        score(s, ["GOOD8"])
    assert len((tmp_path / JUDGE_CACHE_FILE).read_text().splitlines()) == 1
    with JudgeScorer(cfg, run_dir=tmp_path) as s:
        again = score(s, ["GOOD8"])
    assert again.scores == pytest.approx([0.8]) and fake.requests[prompt_of("GOOD8")] == 1
    with JudgeScorer(config(fake.url, cache=JudgeCache.OFF)) as s:
        score(s, ["GOOD8"])
        score(s, ["GOOD8"])
    assert fake.requests[prompt_of("GOOD8")] == 3


def test_the_api_key_comes_from_the_named_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeJudge(api_key="s3cret") as fake:
        cfg = config(fake.url, api_key_env="QUARTET_TEST_JUDGE_KEY")
        monkeypatch.delenv("QUARTET_TEST_JUDGE_KEY", raising=False)
        with pytest.raises(ValueError, match="QUARTET_TEST_JUDGE_KEY is not set"):
            JudgeScorer(cfg)
        monkeypatch.setenv("QUARTET_TEST_JUDGE_KEY", "s3cret")
        with JudgeScorer(cfg) as s:
            assert score(s, ["GOOD4"]).scores == pytest.approx([0.4])
        with JudgeScorer(config(fake.url)) as s:  # no key: 401, not retried
            failed = score(s, ["GOOD4"])
    assert "HTTP 401" in failed.failures[0][1] and sum(fake.requests.values()) == 2


def test_a_rubric_file_is_filled_and_sent_with_the_settings(fake: FakeJudge, tmp_path: Path) -> None:
    rubric = tmp_path / "rubric.txt"
    rubric.write_text('Q: {question}\nA: {response}\nRef: {ground_truth}\nAnswer as {"score": n}.')
    with JudgeScorer(config(fake.url, rubric_file=str(rubric), max_tokens=7, temperature=0.5)) as s:
        s.score(["Why?", "How?"], ["TAG2 {question}", "GOOD1"], [None, 12])
    sent = [b["messages"] for b in fake.bodies]
    assert sent == [
        [
            {
                "role": "user",
                "content": 'Q: Why?\nA: TAG2 {question}\nRef: (none given)\nAnswer as {"score": n}.',
            }
        ],
        [{"role": "user", "content": 'Q: How?\nA: GOOD1\nRef: 12\nAnswer as {"score": n}.'}],
    ]
    assert {(b["model"], b["max_tokens"], b["temperature"]) for b in fake.bodies} == {("fake-judge", 7, 0.5)}
    rubric.write_text("no placeholder")
    with pytest.raises(ConfigError, match="rubric_file"):
        JudgeScorer(config(fake.url, rubric_file=str(rubric)))


def test_the_computer_adds_the_weighted_judge_score_and_names_failures(
    fake: FakeJudge, tokenizer: Any
) -> None:
    responses = ["GOOD10", "GARBAGE", "TAG5"]
    batch = make_batch(
        tokenizer,
        responses,
        ["4", "4", "4"],
        ["no/rule"] * 3,
        index=[10, 11, 12],
        raw_prompt=[[{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]] * 3,
    )
    cfg = RewardConfig(judge=config(fake.url, weight=2.0, fallback_score=0.0))
    with RewardComputer(cfg, tokenizer, RESPONSE_LENGTH) as computer:  # a judge alone: no rules, no pool
        assert computer._backend is None  # noqa: SLF001
        scored, metrics = computer.score(batch)
        failures = computer.take_failures()
    expected = [2.0 * 1.0, 0.0, 2.0 * 0.5]
    assert scored["scores"].tolist() == pytest.approx(expected)
    assert torch.allclose(
        scored["token_level_scores"], expected_token_scores(expected, batch["response_mask"])
    )
    assert [(f.position, f.row, f.status) for f in failures] == [(1, 11, "bad_verdict")]
    assert metrics[JUDGE_BAD_VERDICTS] == 1.0
    assert all(prompt_of(r) in fake.requests for r in responses)  # the question is the last user message


def test_judge_config_errors_name_the_key() -> None:
    from quartet.config import load_config, validate

    with pytest.raises(ConfigError, match=r"reward\.judge\.model: is empty"):
        validate(load_config(None, ["reward.judge.url=http://localhost:1/v1"]))
    with pytest.raises(ConfigError, match=r"(?s)reward\.judge\.api_key_env.*variable.s NAME"):
        load_config(None, ["reward.judge.api_key_env=sk-live-abc"])
    with pytest.raises(ConfigError, match=r"reward\.judge\.url.*not an http"):
        load_config(None, ["reward.judge.url=localhost:8000"])
    with pytest.raises(ConfigError, match=r"reward\.judge\.rubric.*\{response\}"):
        load_config(None, ["reward.judge.rubric='Grade it.'"])
    with pytest.raises(ConfigError, match=r"reward\.judge\.url: both url and model_path"):
        validate(
            load_config(
                None, ["reward.judge.url=http://h/v1", "reward.judge.model=m", "reward.judge.model_path=/m"]
            )
        )
    with pytest.raises(ConfigError, match=r"reward\.judge\.score_max"):
        load_config(None, ["reward.judge.score_max=0"])
    assert json.dumps(validate(load_config(None, [])).reward.judge.enabled) == "false"
