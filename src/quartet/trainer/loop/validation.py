"""Validation: generate on the held-out prompts, score, and report accuracy per data source.

Sampling is `rollout.val` (greedy, one sample by default). For n samples per prompt, with s = the score of a
response (1/0 for the built-in verifiers):

    val-core/<source>/reward/mean@n   mean of s over all responses of all prompts of that source
    val-core/<source>/reward/pass@n   fraction of prompts with a response scoring 1, when every score of
                                      the source is 0 or 1 (a verifier's verdict; n > 1)
    val-aux/<source>/reward/best@n    mean over prompts of max s over the prompt's n responses (n > 1)

(verl's key layout: `val-core/<data_source>/<variable>/<metric>@<n>`.) Responses are scored as in training:
the reward model first when the run has one, then the rule scorers / the user's function.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from quartet.agents.batch import agent_batch_metrics
from quartet.config import QuartetConfig
from quartet.core.batch import Batch
from quartet.roles.reward_model import RewardModel
from quartet.roles.rollout import Rollout
from quartet.trainer.workers.rollout_calls import RolloutCalls
from quartet.trainer.workers.start import Workers

__all__ = ["validate"]


def validate(
    cfg: QuartetConfig,
    workers: Workers,
    dataset: Any,
    reward: Any,
    step: int,
    on_scored: Callable[[Batch], None] | None = None,
    rollout: RolloutCalls | None = None,
) -> dict[str, float]:
    """Validation metrics of the current policy over the whole of `dataset` (a `PromptDataset`);
    `on_scored` sees each scored batch of generations (for rollout records); `rollout`: the calls on the
    rollout group (the healing view with recovery on; None: the plain group of `workers`)."""
    n = cfg.rollout.val.n
    calls = rollout if rollout is not None else RolloutCalls(workers.rollout)
    per_prompt: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    total = len(dataset)
    agent_rows: list[Batch] = []
    for start in range(0, total, cfg.data.val_batch_size):
        indices = list(range(start, min(start + cfg.data.val_batch_size, total)))
        prompts = dataset.batch(indices).with_meta(validation=True, global_step=step)
        generated = calls.call_batch(Rollout.generate, prompts)
        if workers.reward_model is not None:
            rm_scores = workers.reward_model.call_batch(RewardModel.score, generated).select("rm_scores")
            generated = generated.union(rm_scores)
        scored, _ = reward.score(generated)
        if on_scored is not None:
            on_scored(generated.union(scored))
        if "agent_metrics" in generated.non_tensors:
            agent_rows.append(generated.select("agent_metrics", "finish_reason", "response_mask"))
        scores = scored["scores"].tolist()
        sources = generated.non_tensors["data_source"]
        rows = generated.non_tensors["index"]
        for score, source, row in zip(scores, sources, rows, strict=True):
            per_prompt[str(source)][int(row)].append(float(score))
    metrics: dict[str, float] = {}
    for source, prompts_scores in sorted(per_prompt.items()):
        flat = [s for scores in prompts_scores.values() for s in scores]
        metrics[f"val-core/{source}/reward/mean@{n}"] = sum(flat) / len(flat)
        if n > 1:
            best = [max(scores) for scores in prompts_scores.values()]
            metrics[f"val-aux/{source}/reward/best@{n}"] = sum(best) / len(best)
            if all(s in (0.0, 1.0) for s in flat):
                passed = [1.0 in scores for scores in prompts_scores.values()]
                metrics[f"val-core/{source}/reward/pass@{n}"] = sum(passed) / len(passed)
    if agent_rows:  # multi-turn: turns, tool calls, how conversations ended, on the held-out prompts
        metrics |= {f"val-aux/{k}": v for k, v in agent_batch_metrics(Batch.concat(agent_rows)).items()}
    return metrics
