"""From a batch of responses to token rewards: decode, score (rules, a custom function or a reward model),
shape, place.

For row i with response tokens y_i (right-padded, `response_mask` m_i) and L_i the position after its last
model-written token (the last t with m_i[t] = 1):

    text_i   = decode(y_i[:L_i], skip_special_tokens=True)      tool outputs in between included, as verl
    S_i      = score(data_source_i, text_i, ground_truth_i, extra_info_i)     or rm_scores_i (see below)
    R_i      = S_i + overlong_penalty(L_i)                      only when reward.overlong_buffer > 0
    r[i, t]  = R_i at t = L_i - 1, 0 elsewhere                  (core.reward_shaping.place_outcome_score)

The length the DAPO penalty reads is L_i: the budget the response used, tool outputs included, trailing
padding not. A row without any model-written token is still scored (text "", length 0) but has no token to
hold its reward. The outputs are the new columns only, to `union` into the batch:
- `token_level_scores` [B, R] float32: r above.
- `scores` [B] float32: S_i, the outcome before shaping (the accuracy for 0/1 rules; validation reads it).

Reward functions passed as callables (`reward_funcs`, `callables.RewardFuncs`) take the place of
`reward.function` (both at once is refused): S_i is their weighted sum, run in the same scoring pool.

LLM judge (`reward.judge`, `judge.JudgeScorer`): its score J_i times `reward.judge.weight` is added,
S_i = base_i + w J_i, where base_i is the function's (or callables') score when one is set, the reward
model's score when the batch holds one, 0 otherwise (a judge alone does not run the rules: set
`reward.function=quartet.rewards.rules.registry:default_compute_score` to add them). A bad verdict or a
failed judge request gives J_i = `reward.judge.fallback_score`, counted and named as a failure.

Reward model. When the batch holds `rm_scores` [B] (the reward-model role ran):
- and `reward.function` is empty, S_i = rm_scores_i and no rule runs (verl's choice: the model's score
  replaces the rule's; data without a rule scorer can then be trained on);
- and `reward.function` is set, the function decides: it is called as usual with `extra_info` extended by
  `"rm_score": rm_scores_i` (a dict copy; None becomes a dict), so a function can add, gate or replace.

Failed items (the function raised, timed out, or its worker died: scored 0) are kept as `ScoreFailure`s
with the row's dataset index (the batch's `index` column), for the trainer to name them in
`bad_rows.jsonl`: `take_failures()` hands them over.

Metrics: `reward/error_count`, `reward/timeout_count`, `reward/worker_restarts`, `reward/score_time_s`, the
overlong penalty's `reward/overlong_penalty/mean` and `reward/overlong_fraction`, and for each extra numeric
key a score function returned in a dict, `reward/extra/<key>`: its mean over the rows that returned it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from quartet.config.reward import RewardConfig
from quartet.core.batch import Batch
from quartet.core.metrics import Metrics
from quartet.core.reward_shaping import last_valid_index, overlong_penalty, place_outcome_score
from quartet.rewards.backend import ItemStatus, ScoringBackend
from quartet.rewards.pool import ScorePool
from quartet.rewards.rules.registry import RULE_FUNCTIONS, select_scorer
from quartet.rewards.scoring import (
    REWARD_ERROR_COUNT,
    REWARD_EXTRA_PREFIX,
    REWARD_SCORE_TIME,
    REWARD_TIMEOUT_COUNT,
    REWARD_WORKER_RESTARTS,
    AnyItem,
    FuncItem,
    ScoreItem,
)

if TYPE_CHECKING:
    from quartet.rewards.callables import RewardFuncs
    from quartet.rewards.judge import JudgeScorer

__all__ = ["RewardComputer", "ScoreFailure"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoreFailure:
    """One response whose score call failed (it scored 0)."""

    position: int
    """Its position in the scored batch."""
    row: int | None
    """The dataset row of its prompt (the batch's `index` column); None when the batch has none."""
    status: str
    """`error` or `timeout` (the score call); `bad_verdict` or `judge_failed` (the LLM judge)."""
    reason: str
    """Why, in one line."""
    data_source: str | None


class RewardComputer:
    """Scores batches of responses on the driver with a reused pool of scoring processes."""

    def __init__(
        self,
        cfg: RewardConfig,
        tokenizer: Any,
        max_response_length: int,
        backend: ScoringBackend | None = None,
        *,
        reward_funcs: RewardFuncs | None = None,
        run_dir: Path | None = None,
    ) -> None:
        """Check the shaping settings, start the scoring pool (unless only a reward model or a judge scores)
        and the judge (when `cfg.judge` names one).

        Args:
            cfg: the reward section of the config.
            tokenizer: the policy's tokenizer (decodes the responses).
            max_response_length: `data.max_response_length`, L_max of the overlong penalty.
            backend: scores items instead of a `ScorePool` built from `cfg` (an `InlineScorer` for
                debugging); the caller then owns it and closes it.
            reward_funcs: reward functions given as callables (`RLTrainer(reward_funcs=...)`).
            run_dir: the run folder (the judge's disk cache lives there).
        """
        if cfg.overlong_buffer > max_response_length:
            raise ValueError(
                f"reward.overlong_buffer={cfg.overlong_buffer} is longer than data.max_response_length="
                f"{max_response_length}; the buffer must fit inside the maximum response length"
            )
        if cfg.function and reward_funcs is not None:
            raise ValueError(
                f"reward.function={cfg.function!r} is set and reward_funcs were passed: keep one (a function "
                "of a file can be imported and passed in reward_funcs with the others)"
            )
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.max_response_length = max_response_length
        self.reward_funcs = reward_funcs
        self._custom = bool(cfg.function) or reward_funcs is not None
        self._backend = backend
        self._owns_backend = backend is None
        self._warned_rm_extra_info = False
        self._failures: list[ScoreFailure] = []
        self._judge: JudgeScorer | None = None
        if cfg.judge.enabled:
            from quartet.rewards.judge import JudgeScorer

            self._judge = JudgeScorer(cfg.judge, run_dir)
        try:
            if backend is None and (self._custom or not (cfg.model_path or cfg.judge.enabled)):
                self._backend = self._start_pool()
        except BaseException:
            self.close()
            raise

    def _start_pool(self) -> ScorePool:
        function = self.reward_funcs or self.cfg.function or RULE_FUNCTIONS[str(self.cfg.rule_mode)]
        return ScorePool(function, num_workers=self.cfg.num_workers, timeout_s=self.cfg.timeout_s)

    def _scorer(self) -> ScoringBackend:
        """The backend, started on first use when only a reward model was expected to score."""
        if self._backend is None:
            self._backend = self._start_pool()
        return self._backend

    def take_failures(self) -> list[ScoreFailure]:
        """The score calls that failed since the last call of this method (their rows scored 0)."""
        out, self._failures = self._failures, []
        return out

    def close(self) -> None:
        """Stop the scoring processes (when this object started them) and the local judge."""
        if self._backend is not None and self._owns_backend:
            self._backend.close()
            self._backend = None
        if self._judge is not None:
            self._judge.close()
            self._judge = None

    def __enter__(self) -> RewardComputer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- decoding ---------------------------------------------------------------------------------------

    @staticmethod
    def response_lengths(batch: Batch) -> torch.Tensor:
        """L_i [B] int64: positions up to and including the last model-written token (0 without one)."""
        return last_valid_index(batch["response_mask"]) + 1

    def response_texts(self, batch: Batch) -> list[str]:
        """The decoded responses (special tokens skipped), as the score functions see them."""
        lengths = self.response_lengths(batch).tolist()
        rows = [ids[:n].tolist() for ids, n in zip(batch["responses"], lengths, strict=True)]
        return list(self.tokenizer.batch_decode(rows, skip_special_tokens=True))

    # ---- scoring ----------------------------------------------------------------------------------------

    def score(self, batch: Batch) -> tuple[Batch, Metrics]:
        """New columns `token_level_scores` [B, R] and `scores` [B] (float32), and the scoring metrics."""
        start = time.perf_counter()
        metrics: Metrics = {}
        texts = self.response_texts(batch)
        if "rm_scores" in batch and not self._custom:
            scores = batch["rm_scores"].detach().to("cpu", torch.float32).reshape(-1)
        elif self._custom or self._judge is None:
            scores, metrics = self._rule_scores(batch, texts)
        else:
            scores = torch.zeros(len(batch), dtype=torch.float32)
        if self._judge is not None:
            judged, judge_metrics = self._judge_scores(batch, texts)
            scores = scores + self.cfg.judge.weight * judged
            metrics.update(judge_metrics)
        outcome = scores
        if self.cfg.overlong_buffer > 0:
            shaped = overlong_penalty(
                self.response_lengths(batch).cpu(),
                self.max_response_length,
                self.cfg.overlong_buffer,
                self.cfg.overlong_penalty_factor,
            )
            outcome = scores + shaped.penalty.to(torch.float32)
            metrics.update(shaped.metrics)
        token_level = place_outcome_score(outcome, batch["response_mask"].to("cpu"))
        metrics[REWARD_SCORE_TIME] = time.perf_counter() - start
        new = Batch(
            {"token_level_scores": token_level, "scores": scores}, meta=batch.meta, batch_size=len(batch)
        )
        return new, metrics

    def _rows(self, batch: Batch) -> list[int | None]:
        if "index" not in batch.non_tensors:
            return [None] * len(batch)
        return [None if index is None else int(index) for index in batch.non_tensors["index"]]

    def _judge_scores(self, batch: Batch, texts: list[str]) -> tuple[torch.Tensor, Metrics]:
        """J_i of each response from the LLM judge; bad verdicts and failed requests become failures."""
        from quartet.rewards.judge_prompt import question_text

        assert self._judge is not None
        size = len(batch)
        if "raw_prompt" in batch.non_tensors:
            questions = [question_text(p) for p in batch.non_tensors["raw_prompt"]]
        else:
            questions = list(self.tokenizer.batch_decode(batch["prompts"].tolist(), skip_special_tokens=True))
        truths = [_plain(g) for g in self._column(batch, "ground_truth", size, required=False)]
        result = self._judge.score(questions, texts, truths)
        rows, sources = self._rows(batch), self._column(batch, "data_source", size, required=False)
        for i, (kind, why) in sorted(result.failures.items()):
            source = None if sources[i] is None else str(sources[i])
            self._failures.append(ScoreFailure(i, rows[i], kind, why, source))
        return torch.tensor(result.scores, dtype=torch.float32), dict(result.metrics)

    def _rule_scores(self, batch: Batch, texts: list[str]) -> tuple[torch.Tensor, Metrics]:
        items = self._items(batch, texts)
        result = self._scorer().score(items)
        rows = self._rows(batch)
        for i, status in enumerate(result.statuses):
            if status is not ItemStatus.OK:
                reason = result.reasons.get(i, "the score call failed")
                self._failures.append(ScoreFailure(i, rows[i], str(status), reason, items[i].data_source))
        metrics: Metrics = {
            REWARD_ERROR_COUNT: float(result.error_count),
            REWARD_TIMEOUT_COUNT: float(result.timeout_count),
            REWARD_WORKER_RESTARTS: float(result.restarts),
        }
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for extras in result.extras:
            for key, value in extras.items():
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
        for key, total in sums.items():
            metrics[REWARD_EXTRA_PREFIX + key] = total / counts[key]
        return torch.tensor(result.scores, dtype=torch.float32), metrics

    def _items(self, batch: Batch, texts: list[str]) -> list[AnyItem]:
        """One score call's arguments per row; with the rules, data sources are checked here, up front."""
        if self.reward_funcs is not None:
            return self._func_items(batch, texts)
        size = len(batch)
        sources = self._column(batch, "data_source", size)
        truths = self._column(batch, "ground_truth", size)
        extra = self._column(batch, "extra_info", size)
        if not self.cfg.function:
            for source in sorted({str(s) for s in sources}):
                select_scorer(source)  # an unknown data source is a config error, not 0 on every row
        if "rm_scores" in batch:
            rm = batch["rm_scores"].detach().to("cpu", torch.float64).reshape(-1).tolist()
            extra = [self._with_rm_score(e, r) for e, r in zip(extra, rm, strict=True)]
        return [
            ScoreItem(str(s) if s is not None else None, t, _plain(g), _plain(e))
            for s, t, g, e in zip(sources, texts, truths, extra, strict=True)
        ]

    def _func_items(self, batch: Batch, texts: list[str]) -> list[AnyItem]:
        """Per row: its prompt, its text, and every other column (TRL passes a row's columns as kwargs)."""
        size = len(batch)
        columns = {k: list(v) for k, v in batch.non_tensors.items() if k != "raw_prompt"}
        lengths = self.response_lengths(batch).tolist()
        columns["completion_ids"] = [
            ids[:n].tolist() for ids, n in zip(batch["responses"], lengths, strict=True)
        ]
        if "rm_scores" in batch:
            columns["rm_score"] = batch["rm_scores"].detach().to("cpu", torch.float64).reshape(-1).tolist()
        prompts = self._column(batch, "raw_prompt", size, required=False)
        items: list[AnyItem] = []
        for i, text in enumerate(texts):
            row = {k: _plain(v[i]) for k, v in columns.items()}
            source = row.get("data_source")
            items.append(FuncItem(_plain(prompts[i]), text, row, None if source is None else str(source)))
        return items

    def _column(self, batch: Batch, name: str, size: int, required: bool = True) -> list[Any]:
        if name in batch.non_tensors:
            return list(batch.non_tensors[name])
        if self._custom or name == "extra_info" or not required:
            return [None] * size
        raise KeyError(
            f"the batch has no '{name}' column, which the rule scorers need (they choose by data_source and "
            f"compare with ground_truth); the batch has {batch.keys()}. Fix: give the data set that column, "
            "or set reward.function to a function that does without it"
        )

    def _with_rm_score(self, extra_info: Any, rm_score: float) -> Any:
        if extra_info is None:
            return {"rm_score": rm_score}
        if isinstance(extra_info, Mapping):
            return {**extra_info, "rm_score": rm_score}
        if not self._warned_rm_extra_info:
            self._warned_rm_extra_info = True
            logger.warning(
                "extra_info is a %s, not a dict: the reward-model score cannot be passed to reward.function",
                type(extra_info).__name__,
            )
        return extra_info


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as Python objects, so any score function can compare them with `==`."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
