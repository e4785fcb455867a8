"""Hang watchdog: a deadline on the driver's waits during a named phase, and every rank's Python stacks when
one passes.

A rank that is alive but stuck (in a collective whose peer skipped it, in a call that never returns) would
otherwise hold the run until `cluster.call_timeout_s` and then be reported only by number. Instead:

- each host process registers `faulthandler` on `HANG_SIGNAL` at start (`install_stack_dump`): the signal
  makes the interpreter write every thread's stack to a per-process file, even while the main thread is
  blocked in C code (a gloo or NCCL collective), because faulthandler writes from the C signal handler;
- the trainer opens a `phase_deadline(phase, step, timeout_s, stacks_file)` around each phase of a step;
  `HostSet` waits never past the earliest open deadline;
- when one passes, `hang_error` signals every rank of the role (a same-node rank directly, a rank on another
  node through a small Ray task pinned to its node), reads the new part of each rank's file back (bounded
  by `DUMP_WAIT_S` per rank and `COLLECT_WAIT_S` in all), writes them to the stacks file, and returns a
  `HangError` naming the phase, the step, the silent ranks with their node and the top frame of the
  thread that runs the call on each;
- a rank that cannot run its handler (stopped by SIGSTOP: `/proc/<pid>/stat` state `T`; or silent for
  `ANSWER_WAIT_S` after the signal) is read by py-spy instead, on its own node
  (`quartet.cluster.stopped_stacks`), and its state is named with its stack.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import re
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quartet.cluster.errors import WorkerError
from quartet.cluster.stopped_stacks import (
    PY_SPY_TIMEOUT_S,
    describe_state,
    is_stopped,
    process_state,
    py_spy_stacks,
    py_spy_top_frame,
    runs_a_call,
)

__all__ = [
    "ANSWER_WAIT_S",
    "COLLECT_WAIT_S",
    "DUMP_WAIT_S",
    "HANG_SIGNAL",
    "HangError",
    "PhaseDeadline",
    "active_deadline",
    "collect_stacks",
    "hang_error",
    "install_stack_dump",
    "phase_deadline",
    "silent_states",
    "top_frame",
]

HANG_SIGNAL = signal.SIGUSR1
"""Unused by Ray, torch and Python itself; its default action ends a process, so only a rank that reported
a stacks file (faulthandler registered) is ever sent it."""
ANSWER_WAIT_S = 2.0
"""A signalled rank's faulthandler writes in milliseconds; past this it is read by py-spy instead."""
DUMP_WAIT_S = ANSWER_WAIT_S + PY_SPY_TIMEOUT_S
"""One rank's stacks at most: the handler's answer, then py-spy's read (a stopped rank: py-spy alone)."""
COLLECT_WAIT_S = 15.0
"""All ranks' stacks together, a Ray task's start on another node included: the report never hangs
itself. A rank on the driver's node is read within `DUMP_WAIT_S`; this bound is for the others."""
STATE_LINE = "process state: "
"""The first line of the stacks of a rank that was read by py-spy: its state in words."""


@dataclass(frozen=True)
class PhaseDeadline:
    """An open phase of a step and the monotonic time by which its waits must be answered."""

    phase: str
    step: int
    timeout_s: float
    stacks_file: Path
    deadline: float


_OPEN: list[PhaseDeadline] = []


@contextmanager
def phase_deadline(phase: str, step: int, timeout_s: float, stacks_file: Path) -> Iterator[PhaseDeadline]:
    """Bound every `HostSet` wait inside the block to `timeout_s` from now; a wait that passes it fails
    with a `HangError` whose stacks go to `stacks_file`."""
    watch = PhaseDeadline(phase, step, timeout_s, stacks_file, time.monotonic() + timeout_s)
    _OPEN.append(watch)
    try:
        yield watch
    finally:
        _OPEN.remove(watch)


def active_deadline() -> PhaseDeadline | None:
    """The open phase deadline that passes first (phases may nest), or None outside any phase."""
    return min(_OPEN, key=lambda w: w.deadline) if _OPEN else None


class HangError(WorkerError):
    """A phase of a step passed its deadline while ranks of a role were silent; the message names the
    phase, the step, each silent rank with its node and top frame, and the file with every rank's stacks."""

    def __init__(
        self, role: str, watch: PhaseDeadline, method: str, silent: dict[int, str], node: str
    ) -> None:
        self.phase = watch.phase
        self.step = watch.step
        self.silent = sorted(silent)
        self.stacks_file = watch.stacks_file
        frames = "; ".join(f"rank {rank}: {frame}" for rank, frame in sorted(silent.items()))
        cause = (
            f"phase '{watch.phase}' of step {watch.step} passed its deadline of {watch.timeout_s:.0f} s "
            f"(trainer.hang_timeout_s; 0: derived) waiting for {method}(); silent ranks {sorted(silent)}; "
            f"top frames: "
            f"{frames}; every rank's stacks: {watch.stacks_file}"
        )
        super().__init__(role, min(silent), node, cause)


def install_stack_dump(name: str) -> str:
    """Register faulthandler on `HANG_SIGNAL` for this process, writing to a file of its own; the path to
    read it by.

    Where `/proc` exists the file has no name at all (`tempfile.TemporaryFile`) and is read through
    `/proc/<pid>/fd/<fd>`: it lives as long as the process holds it, so nothing is left behind however the
    process ends (a SIGKILL included), not even a folder. Elsewhere it is a named file under
    `$TMPDIR/quartet-stacks/`, removed when the process exits normally.
    """
    if Path(f"/proc/{os.getpid()}/fd").is_dir():
        anonymous = tempfile.TemporaryFile("w")  # noqa: SIM115 - faulthandler keeps it alive while registered
        faulthandler.register(HANG_SIGNAL, file=anonymous, all_threads=True, chain=False)
        return f"/proc/{os.getpid()}/fd/{anonymous.fileno()}"
    folder = Path(tempfile.gettempdir()) / "quartet-stacks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{os.getpid()}.txt"
    stream = path.open("a")  # faulthandler keeps the file object alive for as long as it is registered
    faulthandler.register(HANG_SIGNAL, file=stream, all_threads=True, chain=False)
    atexit.register(path.unlink, missing_ok=True)
    return str(path)


def dump_stacks(pid: int, path: str, wait_s: float = ANSWER_WAIT_S) -> str:
    """`pid`'s stacks (runs on the rank's node): what its faulthandler appends to `path` on the signal; a
    stopped process (it runs no handler until continued), or one whose handler gave nothing within
    `wait_s`, is read by py-spy instead, after a `STATE_LINE` naming its state."""
    state = process_state(pid)
    if is_stopped(state):  # no signal: it would stay pending and dump whenever the rank is continued
        return f"{STATE_LINE}{describe_state(state)}; pid {pid}\n{py_spy_stacks(pid)}"
    start = os.path.getsize(path) if os.path.exists(path) else 0
    os.kill(pid, HANG_SIGNAL)
    deadline, last = time.monotonic() + wait_s, -1
    while time.monotonic() < deadline:
        time.sleep(0.05)
        size = os.path.getsize(path)
        if size > start and size == last:  # written and no longer growing
            break
        last = size
    with open(path, encoding="utf-8", errors="replace") as f:
        f.seek(start)
        text = f.read()
    if text.strip():
        return text
    state = process_state(pid)
    return (
        f"{STATE_LINE}{describe_state(state)}; pid {pid}; its faulthandler wrote nothing within "
        f"{wait_s:.0f} s of the signal\n{py_spy_stacks(pid)}"
    )


def collect_stacks(nodes: list[dict[str, Any]], here: str | None) -> dict[int, str]:
    """Every rank's stacks (rank -> faulthandler text) from the host facts `nodes`; a rank on node `here`
    is signalled from this process, one elsewhere by a Ray task pinned to its node. Bounded in time."""
    jobs: dict[int, Callable[[], str]] = {}
    for rank, info in enumerate(nodes):
        pid = info.get("pid")
        path = info.get("stacks_file")
        node_id = info.get("node_id")
        if not path or pid is None:
            continue
        jobs[rank] = _job(int(pid), str(path), str(node_id), here)
    deadline = time.monotonic() + COLLECT_WAIT_S
    stacks: dict[int, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(jobs)))) as pool:
        futures = {rank: pool.submit(job) for rank, job in jobs.items()}
        for rank, future in futures.items():
            try:
                stacks[rank] = future.result(timeout=max(0.1, deadline - time.monotonic()))
            except Exception as err:  # a dead or unreachable rank: say so in its place
                stacks[rank] = f"(no stacks: {type(err).__name__}: {err})\n"
    return stacks


def _job(pid: int, path: str, node_id: str, here: str | None) -> Callable[[], str]:
    if node_id == here or node_id == "local":
        return lambda: dump_stacks(pid, path)

    def remote() -> str:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0)(dump_stacks).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        )
        return str(ray.get(task.remote(pid, path), timeout=COLLECT_WAIT_S))

    return remote


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)')


def top_frame(stacks: str) -> str:
    """`file:line function` of the innermost frame of the thread that runs the driver's call (the one
    whose stack passes through the host's `call`/`execute`), else of the current or first thread."""
    spied = py_spy_top_frame(stacks)
    if spied is not None:
        return spied
    threads = [block for block in re.split(r"\n\s*\n", stacks) if _FRAME.search(block.split("\n", 1)[-1])]
    frames = [[m for m in map(_FRAME.match, block.splitlines()) if m] for block in threads]
    running = [
        f
        for f in frames
        if any(
            m["file"].endswith(os.path.join("cluster", "host.py")) and m["fn"] in ("call", "execute")
            for m in f
        )
    ]
    current = [f for f, block in zip(frames, threads, strict=True) if block.lstrip().startswith("Current")]
    chosen = (running or current or frames or [[]])[0]
    if not chosen:
        return "(no Python frame)"
    m = chosen[0]
    return f"{Path(m['file']).name}:{m['line']} {m['fn']}"


def hang_error(
    role: str, method: str, watch: PhaseDeadline, silent: list[int], nodes: list[dict[str, Any]]
) -> HangError:
    """Collect every rank's stacks into `watch.stacks_file` and the error naming the silent ranks."""
    here = _this_node()
    stacks = collect_stacks(nodes, here)
    lines = [f"# phase '{watch.phase}' of step {watch.step}, role '{role}', {method}(): silent {silent}\n"]
    for rank, text in sorted(stacks.items()):
        info = nodes[rank]
        state = "SILENT" if rank in silent else "answered"
        lines.append(f"\n## rank {rank} ({state}) on {info.get('ip')} pid {info.get('pid')}\n{text}")
    watch.stacks_file.parent.mkdir(parents=True, exist_ok=True)
    watch.stacks_file.write_text("".join(lines))
    node = _describe(nodes, silent[0])
    return HangError(role, watch, method, {r: _named_frame(r, stacks, nodes) for r in silent}, node)


def silent_states(silent: list[int], nodes: list[dict[str, Any]]) -> str:
    """`; rank R: stopped (SIGSTOP)` for each rank of `silent` on this node whose process state explains
    its silence (stopped, in a kernel wait, a zombie); empty when none does or none is on this node. For the
    call timeout's message: a wait outside every phase gets no stacks, but a stopped rank is still named."""
    here, parts = _this_node(), []
    for rank in silent:
        info = nodes[rank] if rank < len(nodes) else {}
        if info.get("pid") is None or str(info.get("node_id")) not in (str(here), "local"):
            continue
        state = process_state(int(info["pid"]))
        if state in ("T", "t", "D", "Z"):
            parts.append(f"rank {rank}: {describe_state(state)}")
    return "".join(f"; {part}" for part in parts)


def _named_frame(rank: int, stacks: dict[int, str], nodes: list[dict[str, Any]]) -> str:
    text = stacks.get(rank, "")
    frame = top_frame(text) if text else "(no stacks)"
    why = [line for line in text.splitlines() if line.startswith("(no ")]
    if frame == "(no Python frame)" and why:  # why there is none (py-spy's error and its fix)
        frame = why[0]
    if text.startswith(STATE_LINE):  # read by py-spy: the process state comes first
        if not why and not runs_a_call(text):  # stopped between calls: the waited-for call never began
            frame = f"in no call (the call had not started), {frame}"
        frame = f"{text[len(STATE_LINE) :].split(';', 1)[0]}, {frame}"
    return f"{frame} on {_describe(nodes, rank)}"


def _describe(nodes: list[dict[str, Any]], rank: int) -> str:
    if rank >= len(nodes):
        return "unknown"
    info = nodes[rank]
    return f"{info.get('ip')} (node {str(info.get('node_id'))[:8]}, pid {info.get('pid')})"


def _this_node() -> str | None:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else None
    except Exception:  # no Ray here: every rank is then signalled through its own node's task
        return None
