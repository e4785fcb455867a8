"""The `BatchSource` contract of sync generation, with stand-ins for the rollout and the scorer: what the
step gets (scored batch, metrics, sampler state after its draws, the spans it waited for generation) and
dynamic sampling's extra draws, in order, inside the step's `gen` phase."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from quartet.config import load_config
from quartet.core.batch import Batch
from quartet.trainer.feed.batch_source import SourcedBatch, SyncGeneration
from quartet.trainer.records.phase_timer import PhaseTimer

N = 2  # responses per prompt


class _Rollout:
    """Generates N rows per prompt; scores set by `good` (a row's uid -> all-equal scores or not)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def call_batch(self, method: Any, prompts: Batch, greedy: bool = False) -> Batch:
        uids = [u for u in prompts.non_tensors["uid"] for _ in range(N)]
        self.calls.append((str(prompts.non_tensors["uid"][0]), greedy))
        rows = len(uids)
        ones = torch.ones(rows, 3, dtype=torch.long)  # one prompt token, three response tokens
        columns = {"prompts": ones[:, :1], "responses": ones, "response_mask": ones}
        columns["attention_mask"] = torch.ones(rows, 4, dtype=torch.long)
        return Batch(columns, {"uid": uids}, batch_size=rows)


class _Scorer:
    """Scores each group 0/1 (informative) when its uid says so, else all 0."""

    def score_rollout(
        self, batch: Batch, timer: PhaseTimer, baseline: Batch | None = None
    ) -> tuple[Batch, dict[str, float]]:
        uids = batch.non_tensors["uid"]
        scores = [float(i % 2) if "good" in str(u) else 0.0 for i, u in enumerate(uids)]
        column = torch.tensor(scores).unsqueeze(-1).repeat(1, 3)
        return batch.union(Batch({"token_level_scores": column})), {
            "reward/baseline": float(baseline is not None)
        }


def _prompts(step: int, k: int, good: bool) -> Batch:
    uids = [f"s{step}-d{k}-p{i}" + ("-good" if good else "") for i in range(2)]
    return Batch({}, {"uid": uids}, batch_size=2)


def _source(dynamic: bool, greedy: bool, draws: list[tuple[int, int]]) -> tuple[SyncGeneration, _Rollout]:
    cfg = load_config(None, [f"rollout.n={N}", "algorithm.max_num_gen_batches=3"], check=False)
    rollout = _Rollout()
    plan = SimpleNamespace(dynamic_sampling=dynamic, greedy_baseline=greedy)
    workers: Any = SimpleNamespace(rollout=rollout, plan=plan)

    def draw(step: int, k: int) -> Batch:
        draws.append((step, k))
        return _prompts(step, k, good=k == 2)

    return SyncGeneration(cfg, workers, _Scorer(), draw, lambda: {"drawn": len(draws)}), rollout


def test_sync_generation_hands_the_step_its_scored_batch_state_and_waits() -> None:
    draws: list[tuple[int, int]] = []
    source, rollout = _source(dynamic=False, greedy=True, draws=draws)
    timer = PhaseTimer()
    with source as entered:
        got = entered.take(3, version=7, timer=timer)
    assert isinstance(got, SourcedBatch) and draws == [(3, 0)]
    assert rollout.calls == [("s3-d0-p0", False), ("s3-d0-p0", True)]  # samples, then the greedy baseline
    assert len(got.batch) == 2 * N and "token_level_scores" in got.batch
    assert got.metrics == {"reward/baseline": 1.0} and got.sampler_state == {"drawn": 1}
    (span,) = got.gen_waits
    assert span[0] <= span[1] and "timing_s/gen" in timer.seconds


def test_dynamic_sampling_draws_more_in_order_and_waits_for_each() -> None:
    draws: list[tuple[int, int]] = []
    source, _ = _source(dynamic=True, greedy=False, draws=draws)
    got = source.take(5, version=0, timer=PhaseTimer())
    assert draws == [(5, 0), (5, 1), (5, 2)]  # the third draw is the first with informative groups
    assert got.metrics["dynamic_sampling/gen_batches"] == 3.0
    assert got.metrics["dynamic_sampling/kept_groups"] == 2.0
    assert got.sampler_state == {"drawn": 3}  # the state after every draw of the step
    assert len(got.gen_waits) == 3 and len(got.batch) == 2 * N
