"""Rollout records: what the policy wrote, as JSONL a person (or a script) can read.

`trainer.rollout_freq` = K writes, every K steps, `<run dir>/rollouts/step_<N>.jsonl` with one line per sample
(the first `trainer.rollout_samples` rows of the trained batch), and each validation's generations to
`val_step_<N>.jsonl`. A line:

    {"step": N, "uid": ..., "data_source": ..., "index": row in the dataset, "prompt": text,
     "response": text, "prompt_tokens": int, "response_tokens": int, "finish_reason": ...,
     "ground_truth": ..., "score": float, "reward": float, "advantage": float (first response token),
     "turns": [{"role": "assistant"|"tool"|"user"|"environment", "text": ..., "tokens": int, "mask": 0|1,
                "turn_reward": float, "advantage": float (model turns)}, ...],
     "final_message", "num_turns", "env_reward"   (multi-turn only),
     "images": ["rollouts/images/<sha256>.png", ...]   (vision-language batches only)}

Text is decoded from the token ids the trainer used, padding removed, special tokens kept (they matter when
reading a chat format). Multi-turn rows get `turns`: the conversation turn by turn with who wrote it (the
agent loop's `turn_spans`: the model's turns, tool results, simulated-user replies) and the loss mask (1 on
the model's tokens only); rows without spans but with mask holes are cut into runs of the mask (assistant /
environment). A model turn shows its turn reward and the advantage of its first token. A batch with the
`images` column (a vision-language model's) has each sample's images written once, by content, under
`rollouts/images/` (`quartet.trainer.records.rollout_images`), and its line names them relative to the
run folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from quartet.config import QuartetConfig
from quartet.core.batch import Batch
from quartet.tracking.run_layout import ROLLOUTS_DIR, rollout_records_file
from quartet.trainer.records.rollout_images import ImageStore
from quartet.trainer.records.rollout_tables import TokenTableWriter, turn_spans

__all__ = ["RolloutRecorder", "rollout_rows", "write_rollout_records"]


def _plain(value: Any) -> Any:
    """JSON-safe copy of a non-tensor cell (numpy scalars and arrays become Python values)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def rollout_rows(
    batch: Batch, tokenizer: Any, step: int, limit: int = 0, images: list[list[str]] | None = None
) -> list[dict[str, Any]]:
    """The record of each of the first `limit` rows (0: all) of a generated (and maybe scored) batch;
    `images`: each row's stored image paths (`ImageStore.paths`), recorded as the line's `images`."""
    rows = len(batch) if limit <= 0 else min(limit, len(batch))
    prompt_width = batch["prompts"].shape[1]
    records = []
    for i in range(rows):
        mask = batch["attention_mask"][i]
        prompt_ids = batch["prompts"][i][mask[:prompt_width] != 0].tolist()
        length = int((mask[prompt_width:] != 0).sum())
        response_ids = batch["responses"][i][:length].tolist()
        response_mask = batch["response_mask"][i][:length].tolist()
        rec: dict[str, Any] = {
            "step": step,
            "prompt": tokenizer.decode(prompt_ids),
            "response": tokenizer.decode(response_ids),
            "prompt_tokens": len(prompt_ids),
            "response_tokens": length,
        }
        for key in ("uid", "data_source", "index", "finish_reason", "ground_truth"):
            if key in batch.non_tensors:
                rec[key] = _plain(batch.non_tensors[key][i])
        extra = batch.non_tensors["extra_info"][i] if "extra_info" in batch.non_tensors else None
        if isinstance(extra, dict) and "num_turns" in extra:  # multi-turn: what the agent loop reported
            for key in ("final_message", "num_turns", "env_reward"):
                rec[key] = _plain(extra.get(key))
        if "scores" in batch:
            rec["score"] = float(batch["scores"][i])
        if "token_level_rewards" in batch:
            rec["reward"] = float(batch["token_level_rewards"][i].sum())
        if "advantages" in batch and length:
            first = int(torch.as_tensor(response_mask).argmax()) if any(response_mask) else 0
            rec["advantage"] = float(batch["advantages"][i][first])
        spans = turn_spans(batch, i, response_mask, length)
        if spans is not None:
            rec["turns"] = [_turn(batch, i, tokenizer, response_ids, span) for span in spans]
        if images is not None:
            rec["images"] = images[i]
        records.append(rec)
    return records


def _turn(
    batch: Batch, row: int, tokenizer: Any, response_ids: list[int], span: tuple[str, int, int]
) -> dict[str, Any]:
    """One turn of a record: who wrote it, its text, tokens and mask; for model turns the turn's reward
    (`turn_rewards`, when the environment gave one) and the advantage of its first token."""
    role, start, stop = span
    model = role == "assistant"
    turn: dict[str, Any] = {
        "role": role,
        "text": tokenizer.decode(response_ids[start:stop]),
        "tokens": stop - start,
        "mask": int(model),
    }
    if model and "turn_rewards" in batch:
        turn["turn_reward"] = float(batch["turn_rewards"][row][start:stop].sum())
    if model and "advantages" in batch:
        turn["advantage"] = float(batch["advantages"][row][start])
    return turn


def write_rollout_records(path: Path, records: list[dict[str, Any]]) -> Path:
    """Append `records` to the JSONL file `path` (its folder is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path


class RolloutRecorder:
    """Writes rollout records (`quartet.trainer.records.rollout_records`) as `trainer.rollout_freq` says."""

    def __init__(self, cfg: QuartetConfig, tokenizer: Any, run_dir: Path) -> None:
        self.freq = cfg.trainer.rollout_freq
        self.limit = cfg.trainer.rollout_samples
        self.tokenizer = tokenizer
        self.folder = run_dir / ROLLOUTS_DIR
        self.images = ImageStore(run_dir)
        self.tables = (
            TokenTableWriter(self.folder, tokenizer, self.limit, cfg.trainer.rollout_budget_mb)
            if cfg.trainer.rollout_tokens
            else None
        )

    def train(self, batch: Batch, step: int) -> None:
        if self.freq and step % self.freq == 0:
            images = self.images.paths(batch, len(batch) if self.limit <= 0 else self.limit)
            rows = rollout_rows(batch, self.tokenizer, step, self.limit, images)
            path = self.folder / rollout_records_file(step)
            path.unlink(missing_ok=True)  # a resumed run records the step again: no duplicate lines
            write_rollout_records(path, rows)
            if self.tables is not None:
                self.tables.write(batch, step, images)

    def val_writer(self, step: int) -> Callable[[Batch], None] | None:
        if not self.freq:
            return None

        def write(batch: Batch) -> None:
            rows = rollout_rows(batch, self.tokenizer, step, images=self.images.paths(batch, len(batch)))
            write_rollout_records(self.folder / rollout_records_file(step, val=True), rows)

        return write
