"""Running a turn's tool calls: concurrently, each failure answered to the model, never raised.

    results, metrics = await run_tool_calls(calls, tools, instance_ids, timeout_s=10, max_response_chars=512)

The calls of one turn run at once (`asyncio.gather`); results come back in call order. Whatever the model
wrote, each call gives a `ToolResult`: a call that cannot run or fails has `error` set and `text` a short
message for the model, so it can correct itself on the next turn:

    unknown tool            Error: unknown tool 'calc'; available: calculator, python
    arguments off schema    Error: invalid arguments for 'calculator': 'expression' is a required property
    exception in the tool   Error: tool 'calculator' failed: ValueError: ...   (traceback logged)
    past `timeout_s`        Error: tool 'python' timed out after 10 s          (the call is cancelled)

Every text is cut to `max_response_chars` with a `...[truncated N chars]` marker. Timeouts rely on the
tool yielding to the event loop (see `quartet.agents.tools.base`); cancelling the call is how a tool learns
to stop (the Python tool kills its process then).

Metrics (floats, summed over calls): `tool/calls`, `tool/failed`, `tool/unknown`, `tool/invalid_arguments`,
`tool/exceptions`, `tool/timeouts`, `tool/truncated`, per known tool `tool/<name>/calls` and
`tool/<name>/failed`, and `tool/latency_s/mean`, `tool/latency_s/max`. Unknown names are counted only in
`tool/unknown`: the model chooses them, so they would make unbounded metric keys.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from quartet.agents.tools.base import Tool, ToolResult
from quartet.agents.tools.parsing import ToolCall

__all__ = ["run_tool_calls", "truncate"]

logger = logging.getLogger(__name__)

_COUNTED = ("calls", "failed", "unknown", "invalid_arguments", "exceptions", "timeouts", "truncated")


def truncate(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters plus a `...[truncated N chars]` marker when longer."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}...[truncated {len(text) - max_chars} chars]"


def _failure(text: str, kind: str) -> tuple[ToolResult, str]:
    return ToolResult(text=f"Error: {text}", error=text), kind


async def _run_one(
    call: ToolCall, tools: Mapping[str, Tool], instance_ids: Mapping[str, str], timeout_s: float
) -> tuple[ToolResult, str]:
    """The call's result and its outcome: ok, failed, unknown, invalid_arguments, exceptions, timeouts."""
    tool = tools.get(call.name)
    if tool is None:
        available = ", ".join(sorted(tools)) or "none"
        return _failure(f"unknown tool {call.name!r}; available: {available}", "unknown")
    problem = tool.arguments_error(call.arguments)
    if problem is not None:
        return _failure(f"invalid arguments for {call.name!r}: {problem}", "invalid_arguments")
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            result = await tool.execute(instance_ids[call.name], dict(call.arguments))
    except Exception as exc:  # any failure inside a tool is answered to the model, never raised
        if isinstance(exc, TimeoutError) and deadline.expired():
            return _failure(f"tool {call.name!r} timed out after {timeout_s:g} s", "timeouts")
        logger.warning("tool %r raised on arguments %r", call.name, call.arguments, exc_info=True)
        return _failure(f"tool {call.name!r} failed: {type(exc).__name__}: {exc}", "exceptions")
    if not isinstance(result, ToolResult):
        return _failure(
            f"tool {call.name!r} returned {type(result).__name__}, not a ToolResult", "exceptions"
        )
    return result, ("ok" if result.error is None else "failed")


async def _timed(
    call: ToolCall, tools: Mapping[str, Tool], instance_ids: Mapping[str, str], timeout_s: float
) -> tuple[ToolResult, str, float]:
    start = time.perf_counter()
    result, outcome = await _run_one(call, tools, instance_ids, timeout_s)
    return result, outcome, time.perf_counter() - start


async def run_tool_calls(
    calls: Sequence[ToolCall],
    tools: Mapping[str, Tool],
    instance_ids: Mapping[str, str],
    timeout_s: float,
    max_response_chars: int,
) -> tuple[list[ToolResult], dict[str, float]]:
    """Run `calls` concurrently; one result per call, in order, and the metrics (module docstring).

    `instance_ids` maps each tool name to this trajectory's instance (from `Tool.create`); a known tool
    without an instance is the caller's bug and raises `KeyError` before anything runs.
    """
    missing = sorted({c.name for c in calls if c.name in tools and c.name not in instance_ids})
    if missing:
        raise KeyError(f"no instance id for tool(s) {', '.join(missing)}: call Tool.create first")
    outcomes = await asyncio.gather(*(_timed(c, tools, instance_ids, timeout_s) for c in calls))

    counts: Counter[str] = Counter({f"tool/{kind}": 0 for kind in _COUNTED})
    results: list[ToolResult] = []
    for call, (result, outcome, _) in zip(calls, outcomes, strict=True):
        failed = outcome != "ok"
        counts["tool/calls"] += 1
        counts["tool/failed"] += failed
        if outcome not in ("ok", "failed"):
            counts[f"tool/{outcome}"] += 1
        if call.name in tools:
            counts[f"tool/{call.name}/calls"] += 1
            counts[f"tool/{call.name}/failed"] += failed
        text = truncate(result.text, max_response_chars)
        counts["tool/truncated"] += text != result.text
        results.append(dataclasses.replace(result, text=text))

    metrics = {key: float(value) for key, value in counts.items()}
    latencies = [latency for _, _, latency in outcomes]
    metrics["tool/latency_s/mean"] = sum(latencies) / len(latencies) if latencies else 0.0
    metrics["tool/latency_s/max"] = max(latencies, default=0.0)
    return results, metrics
