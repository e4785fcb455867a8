"""The table of docs/multi_turn.md ("Chat templates across turns"): `quartet check template` on every chat
template the project ships or tests.

    PYTHONPATH=src python tools/template_table.py    # prints the markdown table

Each template is set on the tiny tokenizer (`quartet.models.tiny.build_tiny_tokenizer`), saved to a
temporary folder, and checked by the CLI in a subprocess (`quartet check template DIR --json`), as a user
would run it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SFT_TEST_TEMPLATE = (  # tests/sft/test_sft_data.py: empties every assistant turn but the last
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' and not loop.last -%}{{- '<|im_start|>assistant\\n<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
REWARD_TEST_TEMPLATE = (  # tests/roles/test_critic_and_reward.py: a reward model's own template
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
)


def templates() -> list[tuple[str, str, str]]:
    """(name, where it comes from, Jinja source) of every template shipped or tested."""
    sys.path.insert(0, str(ROOT / "tests" / "agents"))
    from template_cases import TEMPLATES  # type: ignore[import-not-found]  # tests/agents, on the path above

    from quartet.models.tiny import CHAT_TEMPLATE

    out = [("tiny ChatML", "quartet.models.tiny (demo, examples, tests)", CHAT_TEMPLATE)]
    out += [(name, "tests/agents/template_cases.py", source) for name, source in TEMPLATES.items()]
    out.append(("history emptied", "tests/sft/test_sft_data.py", SFT_TEST_TEMPLATE))
    out.append(("reward model", "tests/roles/test_critic_and_reward.py", REWARD_TEST_TEMPLATE))
    return out


def check(folder: Path) -> dict[str, object]:
    """The CLI's JSON verdict for `folder`, or its error line."""
    cmd = [sys.executable, "-m", "quartet.cli.main", "check", "template", str(folder), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if done.stdout.strip():
        verdict: dict[str, object] = json.loads(done.stdout)
        verdict["exit"] = done.returncode
        return verdict
    return {"exit": done.returncode, "error": done.stderr.strip().splitlines()[-1]}


def row(name: str, where: str, verdict: dict[str, object]) -> str:
    """One markdown row: template, source, exit status, prefix property, delta alone, rules."""
    if "error" in verdict:
        error = str(verdict["error"]).replace("check template error: ", "").split(": ", 1)[-1]
        return f"| {name} | {where} | {verdict['exit']} | - | - | refused: {error} |"
    turns = verdict["turns"]
    assert isinstance(turns, list)
    prefix = sum(1 for t in turns if t["extends"])
    alone = sum(1 for t in turns if t["extends"] and t["delta_alone"])
    rules = ", ".join(str(r) for r in verdict["rules"]) or "-"  # type: ignore[attr-defined]
    return f"| {name} | {where} | {verdict['exit']} | {prefix}/{len(turns)} | {alone}/{prefix} | {rules} |"


def main() -> int:
    from quartet.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    lines = [
        "| template | from | exit | turns that extend | of those, delta alone ok | rules |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, where, source) in enumerate(templates()):
            tokenizer.chat_template = source
            folder = Path(tmp) / f"t{i}"
            tokenizer.save_pretrained(folder)
            lines.append(row(name, where, check(folder)))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
