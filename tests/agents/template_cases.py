"""Chat templates written for the template-check tests, each reproducing one family's behaviour across
turns, and a helper that saves the tiny tokenizer with one of them so it loads through `from_pretrained`.

    QWEN3_LIKE       drops `<think>` of assistant turns before the last user message (Qwen3's rule)
    DEFAULT_SYSTEM   inserts "You are a helpful assistant." when the messages have no system prompt
    SORTED_TOOL_JSON re-renders tool calls as JSON with sorted keys and no spaces
    WELL_BEHAVED     ChatML that renders what it is given (reasoning_content as a `<think>` block)
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

_TOOLS = (
    "{%- if tools -%}"
    "{%- set head = messages[0]['content'] + '\\n' if messages[0]['role'] == 'system' else '' -%}"
    "{{- '<|im_start|>system\\n' + head -}}"
    "{{- 'Tools:\\n' -}}{%- for tool in tools -%}{{- tool['function']['name'] + '\\n' -}}{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
)

_CALLS = (
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{{- '<tool_call>\\n' + (call['function'] | tojson) + '\\n</tool_call>' -}}"
    "{%- endfor -%}"
)

_TAIL = (
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_OTHER_ROLES = (
    "{%- if message['role'] == 'system' and loop.first -%}"
    "{%- elif message['role'] != 'assistant' -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- else -%}"
)

WELL_BEHAVED = (
    _TOOLS + "{%- for message in messages -%}" + _OTHER_ROLES + "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if message.get('reasoning_content') -%}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message['content'] or '' -}}" + _CALLS + _TAIL
)

QWEN3_LIKE = (
    _TOOLS + "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for message in messages -%}" + _OTHER_ROLES + "{%- set content = message['content'] or '' -%}"
    "{%- set reasoning = message.get('reasoning_content') or '' -%}"
    "{%- if not reasoning and '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if reasoning and loop.index0 > ns.last_user -%}"
    "{{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- content -}}"
    # as Qwen3: a newline between content and the first call, none after empty content
    "{%- if content and message.get('tool_calls') -%}{{- '\\n' -}}{%- endif -%}" + _CALLS + _TAIL
)

DEFAULT_SYSTEM = WELL_BEHAVED.replace(
    "{%- elif messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}",
    "{%- elif messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}"
    "{%- endif -%}",
)

SORTED_TOOL_JSON = WELL_BEHAVED.replace(
    "(call['function'] | tojson)", "(call['function'] | tojson(sort_keys=True, separators=(',', ':')))"
)

TEMPLATES = {
    "qwen3_like": QWEN3_LIKE,
    "default_system": DEFAULT_SYSTEM,
    "sorted_tool_json": SORTED_TOOL_JSON,
    "well_behaved": WELL_BEHAVED,
}


def save_with_template(tiny_model_dir: Path, template: str, folder: Path) -> Path:
    """The tiny model's tokenizer with `template` as its chat template, saved to `folder`."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = template
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    return folder


HERMES_STRICT = (
    # written for these tests in the style of Hermes-2-Pro's tool template (vLLM's
    # tool_chat_template_hermes.jinja): tools listed in the system turn, calls as <tool_call> JSON, tool
    # results grouped in one `tool` turn as <tool_response> blocks, and a tool message without `name` refused
    "{%- if tools -%}"
    "{%- set head = messages[0]['content'] + '\\n\\n' if messages[0]['role'] == 'system' else '' -%}"
    "{{- '<|im_start|>system\\n' + head + 'You may call functions. Signatures:\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson -}}{{- '\\n' -}}{%- endfor -%}"
    "{{- '</tools><|im_end|>\\n' -}}"
    "{%- elif messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and loop.first -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set fn = call['function'] -%}"
    "{%- set args = fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' -}}"
    "{{- args + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if message.name is not defined -%}"
    "{{- raise_exception(\"a tool message needs a 'name' key: the name of the function called\") -}}"
    "{%- endif -%}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<|im_start|>tool\\n' -}}{%- endif -%}"
    '{{- \'<tool_response>\\n{"name": "\' + message.name + \'", "content": \' -}}'
    "{{- message['content'] | tojson -}}{{- '}\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""Hermes-style tool template (not in TEMPLATES: it is prefix-safe; its tests are in test_tool_messages)."""
