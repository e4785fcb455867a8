"""A learned reward model: a sequence classifier (one label) scoring each response at its last token.

When the reward model was trained with another tokenizer (or chat template) than the policy's, token ids
cannot be passed across: each response is decoded with the policy's tokenizer and re-encoded as a chat
(the row's `raw_prompt` messages when the batch has them, else the decoded prompt as one user turn, then
the response as the assistant turn) with the reward model's template.
"""

from __future__ import annotations

from typing import Any

import torch

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.model import Dtype
from quartet.config.reward import RewardConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind
from quartet.models.loading import load_tokenizer
from quartet.roles.run_values import RunValues

__all__ = ["RewardModel"]


class RewardModel:
    """The reward model on one rank: `rm_scores` [B] for a batch of responses."""

    def __init__(self, cfg: RewardConfig, run: RunValues, mixed_precision: Dtype) -> None:
        """`mixed_precision`: the actor's (`actor.mixed_precision`); the policy's tokenizer is read from
        `run.model_path`."""
        from quartet.engines import TrainingEngine  # the host's import, not the driver's (it reads @dispatch)

        path = cfg.model_path
        if not path:
            raise ValueError("RewardModel needs reward.model_path (a sequence-classification model folder)")
        self.micro = MicroSpec(size=cfg.micro_batch_size_per_device)
        self.engine = TrainingEngine(
            EngineSpec(path, ModelKind.REWARD, mixed_precision=mixed_precision, optim=None)
        )
        self.tokenizer = load_tokenizer(path)
        self.policy_tokenizer = load_tokenizer(run.model_path)
        self.same_tokenizer = (
            self.tokenizer.get_vocab() == self.policy_tokenizer.get_vocab()
            and self.tokenizer.chat_template == self.policy_tokenizer.chat_template
        )

    @dispatch(Split.BY_DP_RANK)
    def score(self, batch: Batch) -> Batch:
        """`rm_scores` [B] float32: the model's output at the last valid token of prompt + response."""
        inputs = batch if self.same_tokenizer else self._reencode(batch)
        return Batch({"rm_scores": self.engine.forward_scores(inputs, self.micro)}, meta=batch.meta)

    def _reencode(self, batch: Batch) -> Batch:
        """prompt + response as a chat in the reward model's template, left-padded, as one prompt."""
        policy, rm = self.policy_tokenizer, self.tokenizer
        raw = batch.non_tensors.get("raw_prompt")
        rows: list[list[int]] = []
        for i in range(len(batch)):
            prompt_ids = batch["prompts"][i][batch["attention_mask"][i, : batch["prompts"].shape[1]] > 0]
            response_ids = batch["responses"][i][batch["response_mask"][i] > 0]
            messages: list[dict[str, Any]] = (
                list(raw[i])
                if raw is not None
                else [{"role": "user", "content": policy.decode(prompt_ids, skip_special_tokens=True)}]
            )
            reply = policy.decode(response_ids, skip_special_tokens=True)
            chat = [*messages, {"role": "assistant", "content": reply}]
            text = rm.apply_chat_template(chat, tokenize=False)
            rows.append(list(rm(str(text), add_special_tokens=False)["input_ids"]))
        width = max(len(r) for r in rows)
        pad = rm.pad_token_id if rm.pad_token_id is not None else 0
        prompts = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width + 1), dtype=torch.long)
        for i, r in enumerate(rows):
            prompts[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) : width] = 1
        return Batch(
            {
                "prompts": prompts,
                # one padding response column: the whole chat is the "prompt" whose last token is scored
                "responses": torch.full((len(rows), 1), pad, dtype=torch.long),
                "response_mask": torch.zeros((len(rows), 1), dtype=torch.long),
                "attention_mask": mask,
            },
            meta=batch.meta,
        )
