"""Greedy exact-match evaluation of a Hugging Face folder on held-out conversations, on the driver.

Each sample is a conversation cut before its last assistant turn; the model answers greedily
(`model.generate`, `do_sample=False`) and the stripped answer text is checked by a verifier: the task's
own (built-in arithmetic: the integer after an optional `expr=`) or, for user data, string equality with
the reference assistant message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from quartet.sft.data import SFTExample

__all__ = ["EvalSample", "ExactMatch", "eval_samples", "exact_text_match", "greedy_exact_match"]

Verifier = Callable[[str, str], bool]
"""(model answer, reference) -> correct."""


@dataclass(frozen=True)
class EvalSample:
    """A question (messages up to the assistant turn to produce) and the reference answer."""

    messages: tuple[dict[str, Any], ...]
    reference: str


@dataclass
class ExactMatch:
    """Accuracy of greedy answers and a few of them for the log."""

    correct: int = 0
    total: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        """Fraction of correct answers (0 when there were no samples)."""
        return self.correct / self.total if self.total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "correct": self.correct, "total": self.total}


def exact_text_match(answer: str, reference: str) -> bool:
    """The default verifier for user data: equal after stripping whitespace."""
    return answer.strip() == reference.strip()


def eval_samples(examples: Sequence[SFTExample], limit: int) -> list[EvalSample]:
    """Up to `limit` samples: each conversation cut before its last assistant message.

    The reference is the row's `ground_truth` when it has one, else that assistant message's content.
    """
    out: list[EvalSample] = []
    for ex in examples[:limit]:
        last = max(i for i, m in enumerate(ex.messages) if m["role"] == "assistant")
        reference = ex.ground_truth if ex.ground_truth is not None else str(ex.messages[last]["content"])
        out.append(EvalSample(tuple(ex.messages[:last]), reference))
    return out


def greedy_exact_match(
    model_dir: str | Path,
    tokenizer: Any,
    samples: Sequence[EvalSample],
    verify: Verifier,
    *,
    max_new_tokens: int = 8,
    batch_size: int = 32,
    keep_examples: int = 4,
) -> ExactMatch:
    """Load the causal LM in `model_dir`, answer every sample greedily, count verified answers."""
    from quartet.models.loading import load_causal_lm

    result = ExactMatch()
    if not samples:
        return result
    model = load_causal_lm(model_dir).eval()  # type: ignore[no-untyped-call]  # unannotated in transformers
    for start in range(0, len(samples), batch_size):
        chunk = samples[start : start + batch_size]
        enc = tokenizer.apply_chat_template(
            [list(s.messages) for s in chunk],
            add_generation_prompt=True,
            padding=True,
            return_tensors="pt",
            return_dict=True,
        )
        with torch.no_grad():
            out = model.generate(
                input_ids=enc["input_ids"],
                attention_mask=enc["attention_mask"],
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        answers = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for sample, answer in zip(chunk, answers, strict=True):
            ok = verify(answer.strip(), sample.reference)
            result.correct += ok
            result.total += 1
            if len(result.examples) < keep_examples:
                question = sample.messages[-1]["content"] if sample.messages else ""
                result.examples.append(
                    {"question": question, "answer": answer.strip(), "reference": sample.reference, "ok": ok}
                )
    return result
