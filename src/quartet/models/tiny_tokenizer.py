"""The tiny models' tokenizer: byte-level BPE trained here on generated text, with a ChatML template.

Nothing is downloaded: the tokenizer is trained with `tokenizers` on text this module generates (arithmetic,
short sentences, chat markup). Digits are split one per token (as in Qwen and Llama 3), so arithmetic
answers are learnable digit by digit. The text models (`quartet.models.tiny`) and the vision-language ones
(`quartet.models.tiny_vision`, which adds its vision tokens and renders image parts) share it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "TOKENIZER_REVISION",
    "build_tiny_tokenizer",
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
