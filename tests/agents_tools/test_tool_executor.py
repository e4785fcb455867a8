"""run_tool_calls: concurrency, every failure answered with an error text, metrics, truncation."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from quartet.agents.tools.base import Tool, ToolResult
from quartet.agents.tools.calculator import CalculatorTool
from quartet.agents.tools.executor import run_tool_calls
from quartet.agents.tools.parsing import ToolCall


def _schema(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": parameters}}


class SleepTool(Tool):
    schema = _schema("sleep", {"seconds": {"type": "number", "minimum": 0}}, ["seconds"])

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = 0

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            await asyncio.sleep(arguments["seconds"])
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return ToolResult(text=f"slept {arguments['seconds']}")


class BoomTool(Tool):
    schema = _schema("boom", {}, [])

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        raise ValueError("boom")


class EchoTool(Tool):
    schema = _schema("echo", {"n": {"type": "integer"}}, ["n"])

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(text="x" * arguments["n"], metrics={"echo/n": float(arguments["n"])})


def _run(calls: list[ToolCall], tools: dict[str, Tool], timeout_s: float = 5.0, max_chars: int = 1000) -> Any:
    async def main() -> Any:
        ids = {name: await tool.create() for name, tool in tools.items()}
        return await run_tool_calls(calls, tools, ids, timeout_s, max_chars)

    return asyncio.run(main())


class RendezvousTool(Tool):
    """Each call waits until `parties` calls have arrived: calls run one after another never all arrive, so
    each would wait out the executor's timeout instead. Concurrency shown without reading a clock."""

    schema = _schema("meet", {}, [])

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.parties = parties
        self.arrived = 0
        self.all_here: asyncio.Event | None = None

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        self.all_here = self.all_here or asyncio.Event()
        self.arrived += 1
        if self.arrived == self.parties:
            self.all_here.set()
        await self.all_here.wait()
        await asyncio.sleep(0.1)
        return ToolResult(text=f"met {self.arrived}")


def test_calls_run_concurrently() -> None:
    tool = RendezvousTool(parties=2)
    results, metrics = _run([ToolCall("meet", {})] * 2, {"meet": tool}, timeout_s=60)
    assert [r.text for r in results] == ["met 2", "met 2"], "the calls did not run at the same time"
    assert metrics["tool/calls"] == 2 and metrics["tool/failed"] == 0 and metrics["tool/timeouts"] == 0
    assert 0.1 <= metrics["tool/latency_s/mean"] <= metrics["tool/latency_s/max"]


def test_unknown_tool() -> None:
    results, metrics = _run([ToolCall("calc", {"expression": "1"})], {"calculator": CalculatorTool()})
    assert results[0].text == "Error: unknown tool 'calc'; available: calculator"
    assert results[0].error is not None
    assert metrics["tool/unknown"] == 1 and metrics["tool/failed"] == 1
    assert not any(k.startswith("tool/calc/") for k in metrics), "model-chosen names make no metric keys"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "'seconds' is a required property"),
        ({"seconds": "soon"}, "seconds: 'soon' is not of type 'number'"),
        ({"seconds": -1}, "seconds: -1 is less than the minimum of 0"),
    ],
)
def test_arguments_off_schema(arguments: dict[str, Any], message: str) -> None:
    tool = SleepTool()
    results, metrics = _run([ToolCall("sleep", arguments)], {"sleep": tool})
    assert results[0].text == f"Error: invalid arguments for 'sleep': {message}"
    assert metrics["tool/invalid_arguments"] == 1 and metrics["tool/sleep/failed"] == 1


def test_exception_inside_tool() -> None:
    results, metrics = _run([ToolCall("boom", {})], {"boom": BoomTool()})
    assert results[0].text == "Error: tool 'boom' failed: ValueError: boom"
    assert metrics["tool/exceptions"] == 1 and metrics["tool/failed"] == 1


def test_timeout_cancels_the_call() -> None:
    tool = SleepTool()
    start = time.perf_counter()
    results, metrics = _run([ToolCall("sleep", {"seconds": 30})], {"sleep": tool}, timeout_s=0.2)
    assert time.perf_counter() - start < 20  # the tool sleeps 30 s: returning earlier is the timeout's doing
    assert results[0].text == "Error: tool 'sleep' timed out after 0.2 s"
    assert tool.cancelled == 1
    assert metrics["tool/timeouts"] == 1 and metrics["tool/failed"] == 1


def test_truncation_and_order_and_counts() -> None:
    tools: dict[str, Tool] = {"echo": EchoTool(), "boom": BoomTool(), "calculator": CalculatorTool()}
    calls = [
        ToolCall("echo", {"n": 100}),
        ToolCall("boom", {}),
        ToolCall("echo", {"n": 3}),
        ToolCall("nope", {}),
        ToolCall("calculator", {"expression": "x"}),  # the tool itself reports an error
    ]
    results, metrics = _run(calls, tools, max_chars=10)
    assert results[0].text == "x" * 10 + "...[truncated 90 chars]"
    assert results[0].metrics == {"echo/n": 100.0}
    assert results[2].text == "xxx"
    assert (
        results[1].text.startswith("Error: too")
        and results[1].error == "tool 'boom' failed: ValueError: boom"
    )
    assert results[3].error is not None and results[3].error.startswith("unknown tool 'nope'")
    assert results[4].error is not None and "names are not allowed" in results[4].error
    expected = {
        "tool/calls": 5,
        "tool/failed": 3,
        "tool/truncated": 4,  # every text but "xxx" is longer than 10 characters
        "tool/echo/calls": 2,
        "tool/echo/failed": 0,
        "tool/boom/calls": 1,
        "tool/boom/failed": 1,
        "tool/calculator/failed": 1,
        "tool/unknown": 1,
        "tool/exceptions": 1,
    }
    assert {k: metrics[k] for k in expected} == expected


def test_missing_instance_is_a_caller_bug() -> None:
    async def main() -> None:
        await run_tool_calls([ToolCall("boom", {})], {"boom": BoomTool()}, {}, 1.0, 100)

    with pytest.raises(KeyError, match="call Tool.create first"):
        asyncio.run(main())


def test_instances_hold_their_kwargs() -> None:
    async def main() -> tuple[str, dict[str, Any], float]:
        tool = EchoTool()
        iid = await tool.create(ground_truth="42")
        state = dict(tool.instances[iid])
        reward = await tool.calc_reward(iid)
        await tool.release(iid)
        assert iid not in tool.instances
        return iid, state, reward

    iid, state, reward = asyncio.run(main())
    assert len(iid) == 32 and state == {"ground_truth": "42"} and reward == 0.0
