"""`quartet demo [key=value ...]`: the main job on the built-in default, on CPU.

Until the trainer exists this runs the tiny-model smoke: build a tiny Qwen2 and its tokenizer, save them,
load them back through `from_pretrained`, render chat prompts, generate, take a few optimizer steps on
worked answers, and score tokens with a value model, packing results into a `Batch` on the way.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

from quartet.config import ConfigError, load_config


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("demo", help="run the built-in demo on CPU (currently the tiny-model smoke)")
    parser.add_argument(
        "overrides", nargs="*", help="dotted config overrides, e.g. model.tiny.hidden_size=128"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(None, args.overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    import torch
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from quartet.core.batch import Batch
    from quartet.models.loading import load_causal_lm, load_tokenizer, load_value_model
    from quartet.models.tiny import ensure_tiny_model, save_value_model

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    console = Console()
    console.rule("[bold]quartet demo: tiny-model smoke (the RL trainer is not built yet)")
    torch.manual_seed(cfg.trainer.seed)
    root = Path(cfg.trainer.output_dir) / "models"

    t0 = time.perf_counter()
    folder = ensure_tiny_model(cfg.model.tiny, root)
    tokenizer, model = load_tokenizer(folder), load_causal_lm(folder)
    params = sum(p.numel() for p in model.parameters())
    console.print(
        f"model  {type(model).__name__}, {params / 1e3:.0f}k parameters, vocab {len(tokenizer)}, "
        f"from {folder} ({time.perf_counter() - t0:.1f} s)"
    )

    rng = random.Random(cfg.data.seed)
    pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(cfg.data.train_batch_size)]
    chats = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in pairs]
    prompts = tokenizer.apply_chat_template(
        chats, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    console.print(f"prompt {tokenizer.decode(prompts['input_ids'][0])!r}", markup=False)

    t0 = time.perf_counter()
    out = model.generate(
        **prompts,
        max_new_tokens=cfg.data.max_response_length,
        do_sample=True,
        temperature=cfg.rollout.temperature,
    )
    responses = out[:, prompts["input_ids"].shape[1] :]
    batch = Batch(
        {
            "prompts": prompts["input_ids"],
            "responses": responses,
            "response_mask": responses != tokenizer.pad_token_id,
        },
        {"ground_truth": [str(a + b) for a, b in pairs]},
    )
    console.print(f"rollout {batch} in {time.perf_counter() - t0:.2f} s", markup=False)
    sample = tokenizer.decode(responses[0], skip_special_tokens=True)
    console.print(f"  sample response (untrained): {sample!r}", markup=False)

    # A few supervised steps on worked answers: the loss must fall.
    texts = [
        tokenizer.apply_chat_template(
            c + [{"role": "assistant", "content": f"The answer is {a + b}."}], tokenize=False
        )
        for c, (a, b) in zip(chats, pairs, strict=True)
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(10):
        loss = model(**enc, labels=labels).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    console.print(f"train  10 AdamW steps on worked answers: loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    value_folder = root / f"{folder.name}-value"
    if not (value_folder / "config.json").exists():
        save_value_model(folder, value_folder)
    critic = load_value_model(value_folder)
    with torch.no_grad():
        values = critic(**enc).logits.squeeze(-1)
    console.print(f"values value model gives {tuple(values.shape)} (one value per token)")
    console.rule("[green]smoke passed")
    return 0
