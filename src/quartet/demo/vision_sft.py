"""Supervised steps and greedy answers of a vision-language model on image chat rows, with transformers alone.

The vision demo (`quartet demo --task vision`, `benchmarks/vision.py`) needs an SFT warm start and a
more-SFT control on image rows, and one scoring of every model on the same held-out images. quartet's SFT
trainer reads text conversations only, so this is a plain loop over the model folder's own tokenizer, chat
template and image processor: a row's user message (its `<image>` placeholders become image content parts,
which the template renders as `<|vision_start|><|image_pad|><|vision_end|>`; each `<|image_pad|>` is then
repeated once per merged patch, as Qwen2-VL's processor does and as quartet's prompt loader does for RL),
then the answer and the end of turn, the loss on those last tokens only. Greedy answers are transformers'
`generate` on the same prompts.

    chat = VisionChat.load(folder)
    seconds, steps = sft(chat, rows, steps=300)           # or seconds=..., a time budget
    chat.save(out)
    correct, total = accuracy(chat, val_rows)             # scored by the task's rule (data_source)
"""

from __future__ import annotations

import io
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quartet.data.images import IMAGE_PLACEHOLDER  # where a row's image goes in its text (verl's layout)

__all__ = [
    "Example",
    "VisionChat",
    "accuracy",
    "collate",
    "expand_pads",
    "greedy_answers",
    "image_parts",
    "row_example",
    "score_answers",
    "sft",
]

_SPLIT = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)})")
Record = dict[str, Any]


def image_parts(text: str) -> list[dict[str, str]]:
    """A message text as content parts: `{"type": "image"}` for each `<image>`, text parts between."""
    parts = []
    for piece in _SPLIT.split(text):
        if piece == IMAGE_PLACEHOLDER:
            parts.append({"type": "image"})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def expand_pads(ids: Sequence[int], pad_id: int, counts: Sequence[int]) -> list[int]:
    """`ids` with the k-th `pad_id` repeated `counts[k]` times; ValueError when the pads are not one per
    image."""
    pads = sum(1 for t in ids if t == pad_id)
    if pads != len(counts):
        raise ValueError(f"{len(counts)} images but {pads} image pad tokens")
    out: list[int] = []
    k = 0
    for t in ids:
        if t == pad_id:
            out.extend([pad_id] * counts[k])
            k += 1
        else:
            out.append(t)
    return out


@dataclass
class Example:
    """One row ready for the model: prompt ids (images expanded), answer ids, its images' pixel inputs."""

    prompt: list[int]
    answer: list[int]
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor


@dataclass
class VisionChat:
    """A vision-language model folder's model, tokenizer and image processor."""

    model: Any
    tokenizer: Any
    processor: Any

    @classmethod
    def load(cls, folder: str | Path) -> VisionChat:
        """The folder's model in float32 (CPU training), its tokenizer and image processor; no download."""
        from transformers import AutoTokenizer

        from quartet.models.loading import load_causal_lm, load_image_processor

        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model, processor = load_causal_lm(folder, torch.float32), load_image_processor(folder)
        return cls(model, tokenizer, processor)

    @property
    def image_id(self) -> int:
        """The `<|image_pad|>` token."""
        from quartet.models.tiny_vision import IMAGE_PAD

        return int(self.tokenizer.convert_tokens_to_ids(IMAGE_PAD))

    def save(self, folder: str | Path) -> Path:
        """Model, tokenizer and image processor in `folder` (a model folder quartet and transformers load)."""
        folder = Path(folder)
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        self.processor.save_pretrained(folder)
        return folder

    def example(self, text: str, images: Sequence[bytes], answer: str = "") -> Example:
        """The prompt of a one-message user turn with `images`, and `answer` + end of turn as the target."""
        from PIL import Image

        pixels = self.processor(
            images=[Image.open(io.BytesIO(b)).convert("RGB") for b in images], return_tensors="pt"
        )
        merge = int(getattr(self.processor, "merge_size", 1))
        counts = [int(g.prod()) // merge**2 for g in pixels["image_grid_thw"]]
        messages = [{"role": "user", "content": image_parts(text)}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        prompt = expand_pads(ids, self.image_id, counts)
        target = self.tokenizer.encode(answer, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Example(prompt, target if answer else [], pixels["pixel_values"], pixels["image_grid_thw"])


def _truth(row: dict[str, Any]) -> str:
    """A row's answer: the chat set's `ground_truth`, or the RL layout's `reward_model.ground_truth`."""
    truth = row.get("ground_truth")
    return str(truth if truth is not None else row["reward_model"]["ground_truth"])


def row_example(chat: VisionChat, row: dict[str, Any], with_answer: bool = True) -> Example:
    """The example of a task row (RL layout: `prompt`, `reward_model.ground_truth`; or the chat set's
    `messages`, `ground_truth`), its images from the `images` column."""
    messages = row.get("messages") or row["prompt"]
    images = [cell["bytes"] if isinstance(cell, dict) else cell for cell in row["images"]]
    return chat.example(messages[0]["content"], images, _truth(row) if with_answer else "")


def collate(examples: Sequence[Example], pad_id: int, image_id: int, left: bool) -> dict[str, torch.Tensor]:
    """A padded batch: `input_ids`, `attention_mask`, `labels` (-100 off the answers), pixels and grids, and
    `mm_token_type_ids` (1 on image tokens: transformers' M-RoPE positions need it)."""
    rows = [e.prompt + e.answer for e in examples]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for i, (e, r) in enumerate(zip(examples, rows, strict=True)):
        start = width - len(r) if left else 0
        ids[i, start : start + len(r)] = torch.tensor(r)
        mask[i, start : start + len(r)] = 1
        labels[i, start + len(e.prompt) : start + len(r)] = torch.tensor(e.answer, dtype=torch.long)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": labels,
        "mm_token_type_ids": ((ids == image_id) & (mask == 1)).long(),
        "pixel_values": torch.cat([e.pixel_values for e in examples]),
        "image_grid_thw": torch.cat([e.image_grid_thw for e in examples]),
    }


def _step(chat: VisionChat, optim: torch.optim.Optimizer, picked: list[Example]) -> float:
    """One AdamW step on `picked`; its loss."""
    loss = chat.model(**collate(picked, 0, chat.image_id, left=False)).loss
    optim.zero_grad(set_to_none=True)
    loss.backward()
    optim.step()
    return float(loss.item())


def sft(
    chat: VisionChat,
    rows: Sequence[dict[str, Any]],
    *,
    steps: int = 0,
    seconds: float = 0.0,
    batch_size: int = 32,
    lr: float = 1e-3,
    beta2: float = 0.95,
    seed: int = 0,
    stop_loss: float = 0.0,
    on_record: Callable[[Record], None] | None = None,
    log_every: int = 50,
) -> tuple[float, int]:
    """Train on `rows` (shuffled each pass) for `steps` optimizer steps or `seconds` of training, whichever
    is given (both: the first reached), or until a step's loss is under `stop_loss` (> 0); (training
    seconds, steps). Every `log_every` steps `on_record` gets
    `{"kind": "train", "step", "epoch", "loss", "train_s"}`, the SFT trainer's progress record."""
    if steps <= 0 and seconds <= 0:
        raise ValueError("give sft a number of steps or a time budget in seconds")
    examples = [row_example(chat, r) for r in rows]
    batch_size = min(batch_size, len(examples))
    rng = random.Random(seed)
    torch.manual_seed(seed)
    # beta2 0.95, not AdamW's 0.999: with the long memory the tiny model sat at "always the commonest
    # count" for 800+ steps (the early large gradients keep the step small); 0.95 leaves it by ~400
    params = [p for p in chat.model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=lr, betas=(0.9, beta2), weight_decay=0.0)
    chat.model.train()
    done = 0
    spent = 0.0
    epoch = 0
    order = list(range(len(examples)))
    stopped = False
    while not stopped and (steps <= 0 or done < steps) and (seconds <= 0 or spent < seconds):
        rng.shuffle(order)
        epoch += 1
        for start in range(0, len(order) - batch_size + 1, batch_size):
            began = time.perf_counter()
            loss = _step(chat, optim, [examples[i] for i in order[start : start + batch_size]])
            spent += time.perf_counter() - began
            done += 1
            if on_record is not None and done % log_every == 0:
                on_record({"kind": "train", "step": done, "epoch": epoch, "loss": loss, "train_s": spent})
            stopped = 0 < loss < stop_loss
            if stopped or (steps > 0 and done >= steps) or (seconds > 0 and spent >= seconds):
                break
    chat.model.eval()
    return spent, done


@torch.no_grad()
def greedy_answers(
    chat: VisionChat, rows: Sequence[dict[str, Any]], max_new_tokens: int = 4, batch_size: int = 64
) -> list[str]:
    """The model's greedy answer to each row's prompt (special tokens dropped)."""
    chat.model.eval()
    pad = chat.tokenizer.pad_token_id if chat.tokenizer.pad_token_id is not None else 0
    texts: list[str] = []
    for start in range(0, len(rows), batch_size):
        examples = [row_example(chat, r, with_answer=False) for r in rows[start : start + batch_size]]
        batch = collate(examples, pad, chat.image_id, left=True)
        batch.pop("labels")
        out = chat.model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
        width = batch["input_ids"].shape[1]
        texts += chat.tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return texts


def score_answers(rows: Sequence[dict[str, Any]], texts: Sequence[str]) -> list[bool]:
    """Whether each answer is right by its row's task rule (`task_scorer` of `data_source`)."""
    from quartet.tasks import task_scorer

    verdicts = []
    for row, text in zip(rows, texts, strict=True):
        scorer = task_scorer(row["data_source"])
        if scorer is None:
            raise ValueError(f"no built-in scorer for data_source {row['data_source']!r}")
        verdicts.append(scorer(text, _truth(row), None) >= 1.0)
    return verdicts


def accuracy(chat: VisionChat, rows: Sequence[dict[str, Any]], max_new_tokens: int = 4) -> tuple[int, int]:
    """(correct, total): greedy answers to `rows`, scored by their task's rule."""
    return sum(score_answers(rows, greedy_answers(chat, rows, max_new_tokens))), len(rows)
