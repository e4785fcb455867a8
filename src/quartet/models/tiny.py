"""Tiny models of real transformers architectures, with a tokenizer trained here, for tests and the demo.

Nothing is downloaded: a byte-level BPE tokenizer is trained with `tokenizers` on text this module
generates (arithmetic, short sentences, chat markup), given a ChatML chat template, and saved next to a
randomly initialised Qwen2 or Llama causal LM. Everything is then loaded back through the ordinary
`AutoTokenizer.from_pretrained` / `AutoModelForCausalLM.from_pretrained` path, like a downloaded checkpoint.

Digits are split one per token (as in Qwen and Llama 3), so arithmetic answers are learnable digit by digit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from quartet.config.model import TinyArch, TinyModelConfig
from quartet.models.loading import load_value_model

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "build_tiny_causal_lm",
    "build_tiny_tokenizer",
    "ensure_tiny_model",
    "save_tiny_model",
    "save_value_model",
]

TOKENIZER_REVISION = 2
"""Bumped when the tokenizer or its template changes, so a cached tiny model of an older one is not reused
(2: tools listed by signature only)."""
PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|endoftext|>", "<|im_start|>", EOS_TOKEN, "<tool_call>", "</tool_call>"]

# ChatML, as used by Qwen: each message is <|im_start|>role\ncontent<|im_end|>\n. Tools are listed in a
# system block, one signature per line (`name(arg, ...)`), without their English descriptions: a model of a
# million parameters cannot read them, and they cost this small vocabulary ~100 tokens per tool (the full
# JSON schema ~300), which would be 40% of every calculator trace (docs/agentic.md). Assistant tool calls
# are written as <tool_call>{json}</tool_call>. Real models keep their own templates and the whole schema.
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\nYou can call these tools:\\n' -}}"
    "{%- for tool in tools -%}{%- set f = tool['function'] if 'function' in tool else tool -%}"
    "{{- f['name'] + '(' + (f.get('parameters', {}).get('properties', {}) | list | join(', ')) + ')\\n' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') -}}"
    "{%- if message.get('tool_calls') -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{{- '<tool_call>' + (call['function'] | tojson) + '</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_WORDS = (  # noqa: SIM905 - one readable string
    "the answer is what compute add subtract multiply sum of and result number target reach using each "
    "once numbers think step first then so we get total equals plus minus times left right question "
    "tool call search weather user assistant system hello thanks please solve final check"
).split()


def _training_text(seed: int, lines: int = 4000) -> Iterator[str]:
    """Text the tokenizer is trained on: arithmetic, word salad and chat markup, deterministic in `seed`."""
    rng = random.Random(seed)
    for _ in range(lines):
        a, b = rng.randint(0, 9999), rng.randint(0, 999)
        op = rng.choice("+-*")
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        yield f"What is {a} {op} {b}? {words}. The answer is {eval(f'{a}{op}{b}')}."  # noqa: S307 - digits only
        yield f"<|im_start|>user\n{words}<|im_end|>\n<|im_start|>assistant\n{words.capitalize()}.<|im_end|>\n"


def build_tiny_tokenizer(
    vocab_size: int = 512, seed: int = 0, extra_special_tokens: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer of `vocab_size` tokens on generated text; it has a chat template.

    `extra_special_tokens` are added after the usual ones (the vision kit's `<|image_pad|>`, ...), never
    split by the BPE."""
    specials = [*SPECIAL_TOKENS, *extra_special_tokens]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers' __init__ is unannotated
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=specials[1:],
        padding_side="left",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_causal_lm(spec: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A randomly initialised causal LM of `spec`'s architecture and shape, sized to the tokenizer."""
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
    )
    torch.manual_seed(spec.seed)
    model: PreTrainedModel
    if spec.arch is TinyArch.QWEN2:
        model = Qwen2ForCausalLM(Qwen2Config(**common))  # type: ignore[no-untyped-call]  # as above
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))  # type: ignore[no-untyped-call]  # as above
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny_model(folder: str | Path, spec: TinyModelConfig | None = None) -> Path:
    """Build tokenizer and causal LM of `spec` and `save_pretrained` both into `folder`."""
    spec = spec or TinyModelConfig()
    if spec.arch.is_vision:
        from quartet.models.tiny_vision import save_tiny_vlm

        return save_tiny_vlm(folder, spec)
    folder = Path(folder)
    tokenizer = build_tiny_tokenizer(spec.vocab_size, spec.seed)
    model = build_tiny_causal_lm(spec, tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def save_value_model(causal_lm_folder: str | Path, folder: str | Path) -> Path:
    """Save to `folder` a value model: the causal LM's trunk and a fresh scalar head (one value per token).

    It is transformers' token-classification model with one label, the layout verl's critics use, so it
    loads with `AutoModelForTokenClassification.from_pretrained(folder)` (or `load_value_model`). A
    vision-language folder gives a `models.vision_value` model (the same call loads it once that module is
    imported) and keeps its image processor's files.
    """
    model = load_value_model(causal_lm_folder)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "processor_config.json",
    ):
        src = Path(causal_lm_folder) / name
        if src.exists():
            shutil.copy(src, folder / name)
    return folder


def ensure_tiny_model(spec: TinyModelConfig, root: str | Path) -> Path:
    """The folder of the tiny model of `spec` under `root`, building it once (keyed by the spec's hash).

    The folder is written under a temporary name and renamed, so concurrent callers and interrupted builds
    never leave a half-written model behind.
    """
    key = {**dataclasses.asdict(spec), "tokenizer_revision": TOKENIZER_REVISION}
    blob = json.dumps(key, sort_keys=True, default=str).encode()
    folder = Path(root) / f"tiny-{spec.arch.value}-{hashlib.sha256(blob).hexdigest()[:12]}"
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    try:
        save_tiny_model(tmp, spec)
        tmp.rename(folder)
    except OSError:
        if not (folder / "config.json").exists():  # not a lost race with another builder
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
