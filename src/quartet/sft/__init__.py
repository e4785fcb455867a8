"""Supervised fine-tuning on chat conversations (`quartet sft`).

- `data`: reading parquet/JSONL conversations, the assistant-only mask, collation into the engine's Batch.
- `worker`: `SFTWorker`, the role that owns the training engine (one optimizer step per call).
- `evaluate`: greedy exact match of a Hugging Face folder on held-out conversations.
- `trainer`: `SFTTrainer`, the driver loop (sampler, steps, validation, metrics, export).
"""

from quartet.sft.data import LoadReport, SFTDataError, SFTExample, collate, load_sft_files, tokenize_chat
from quartet.sft.evaluate import ExactMatch, greedy_exact_match
from quartet.sft.trainer import EpochSampler, SFTResult, SFTTrainer
from quartet.sft.worker import SFTWorker, sft_loss

__all__ = [
    "EpochSampler",
    "ExactMatch",
    "LoadReport",
    "SFTDataError",
    "SFTExample",
    "SFTResult",
    "SFTTrainer",
    "SFTWorker",
    "collate",
    "greedy_exact_match",
    "load_sft_files",
    "sft_loss",
    "tokenize_chat",
]
