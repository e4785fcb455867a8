"""A pool of scoring processes with a time limit per call, whose stuck workers are killed and replaced.

Why not `ProcessPoolExecutor`: a future cannot cancel a call that is running, so one response that sends
a scorer into an endless loop (a catastrophic regex, a huge power in a math checker) would hold a worker
for good and then the whole step. Here the parent owns each worker through two pipes, knows which item
each one is running and since when, and kills a worker (its whole process group, so a scorer's own
subprocesses go too) as soon as its item passes `timeout_s`; a replacement starts at once.

How a call runs: items go one at a time to idle workers (no prefetch: a pipe write to a busy worker could
block the parent for as long as the worker is stuck); `multiprocessing.connection.wait` sleeps until an
answer arrives or the earliest deadline passes. Every item ends as ok, error (the function raised, returned
something that is not a score, could not be pickled, or its worker died) or timeout; errors and timeouts
score 0.0 and are counted; the first traceback of each kind is logged once per pool (a timeout's
"traceback" is the stack the worker was stuck in, dumped by faulthandler just before the kill). A call
never raises because of an item and always returns: each item is bounded by its own deadline.

Process start: each worker is a fresh interpreter, `python -m quartet.rewards.worker`, started with
`subprocess` in a new session. Not `fork`: the caller is often a Ray worker with threads (gRPC, torch),
and a forked child of a threaded process can deadlock on a lock some other thread held. Not
`multiprocessing`'s spawn either: it re-imports the caller's `__main__`, which re-runs a training script
that has no `if __name__ == "__main__"` guard. The parent's `sys.path` is passed on as `PYTHONPATH` so the
workers import what the caller imports. The score function travels as its spec string and each worker
imports it (`custom.load_function`), so closures and `__main__` functions never need pickling.

Lifecycle: workers start in the constructor (a bad spec fails there, in the caller's process), are reused
across calls, and stop with `close()` (or the context manager, or garbage collection / interpreter exit).
`backend.InlineScorer` has the same `score` interface in the calling process, without time limits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from quartet.rewards.backend import DEFAULT_FUNCTION, ItemStatus, LogOnce, PoolResult
from quartet.rewards.custom import PICKLED, RewardFunctionError, load_function, resolve_spec
from quartet.rewards.scoring import AnyItem, ScoreFn

__all__ = ["RewardWorkerError", "ScorePool"]

logger = logging.getLogger(__name__)


class RewardWorkerError(RuntimeError):
    """Scoring workers could not be started (the function failed to load in them, or they never answered)."""


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen[bytes]
    inbox: Connection
    """The parent writes items here."""
    outbox: Connection
    """The parent reads answers here."""
    stack_path: str
    deadline: float
    """Startup deadline while starting; the current item's deadline while busy."""
    state: str = "starting"  # starting | idle | busy
    item: int = -1
    failure: str = field(default="")


def _kill(worker: _Worker) -> None:
    """SIGKILL the worker's process group (its own subprocesses included), reap it, close its pipes."""
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(worker.proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, OSError):
        worker.proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.proc.wait(timeout=5)
    for conn in (worker.inbox, worker.outbox):
        with contextlib.suppress(OSError):
            conn.close()


def _shutdown(workers: list[_Worker], tmpdir: str, owner_pid: int) -> None:
    """Kill what is left and remove the stack files (also the finalizer: no reference to the pool)."""
    if os.getpid() != owner_pid:  # a forked copy of the owner must not stop the owner's workers
        return
    for worker in workers:
        _kill(worker)
    workers.clear()
    shutil.rmtree(tmpdir, ignore_errors=True)


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [p for p in sys.path if isinstance(p, str) and p and os.path.exists(p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, "1")  # N workers x all cores of threads would oversubscribe the machine
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


class ScorePool:
    """`num_workers` scoring processes running one score function, each call limited to `timeout_s`."""

    def __init__(
        self,
        function: str | ScoreFn = "",
        num_workers: int = 1,
        timeout_s: float = 10.0,
        *,
        startup_timeout_s: float = 60.0,
    ) -> None:
        """Load the function here (to fail early with a clear error), then start the workers and wait.

        Args:
            function: `path/to/file.py:fn` or `pkg.module:fn`; empty: the rule of each row's data source;
                or a callable (`callables.RewardFuncs`), sent to each worker pickled with cloudpickle.
            num_workers: processes scoring in parallel.
            timeout_s: limit of one score call; past it the item scores 0 and its worker is replaced.
            startup_timeout_s: limit for a worker to import the function and say it is ready.
        """
        if num_workers < 1 or timeout_s <= 0 or startup_timeout_s <= 0:
            raise ValueError(
                "need num_workers >= 1 and positive timeouts, got "
                f"{num_workers}, {timeout_s}, {startup_timeout_s}"
            )
        self._payload: bytes | None = None
        if callable(function):
            self.spec = PICKLED
            self._payload = _pickled(function)
        else:
            self.spec = resolve_spec(function) if function else DEFAULT_FUNCTION
            load_function(self.spec)
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.restarts = 0
        """Workers replaced since the pool started."""
        self._tmpdir = tempfile.mkdtemp(prefix="quartet-reward-")
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._log = LogOnce(logger)
        self._spawned = 0
        self._closed = False
        self._items: Sequence[AnyItem] = ()
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._tmpdir, os.getpid())
        for _ in range(num_workers):
            self._workers.append(self._spawn())
        self._await_startup()

    # ---- lifecycle --------------------------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        self._spawned += 1
        stack_path = os.path.join(self._tmpdir, f"stack-{self._spawned}.txt")
        child_in, parent_out = os.pipe()
        parent_in, child_out = os.pipe()
        args = [self.spec, str(child_in), str(child_out), str(os.getpid()), stack_path]
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "quartet.rewards.worker", *args],
                pass_fds=(child_in, child_out),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                env=_worker_env(),
            )
        finally:
            os.close(child_in)
            os.close(child_out)
        inbox = Connection(parent_out, readable=False)
        outbox = Connection(parent_in, writable=False)
        if self._payload is not None:  # in a thread: a payload over the pipe's buffer waits for the reader
            threading.Thread(
                target=_send_quietly, args=(inbox, self._payload), name="quartet-reward-payload", daemon=True
            ).start()
        return _Worker(proc, inbox, outbox, stack_path, time.monotonic() + self.startup_timeout_s)

    def _await_startup(self) -> None:
        """Wait until every worker is ready; on any failure stop them all and raise RewardWorkerError."""
        while any(w.state == "starting" for w in self._workers):
            starting = [w for w in self._workers if w.state == "starting"]
            remaining = min(w.deadline for w in starting) - time.monotonic()
            for conn in wait([w.outbox for w in starting], timeout=max(0.0, remaining)):
                self._on_message(next(w for w in starting if w.outbox is conn), None)
            for worker in starting:
                if worker.state == "starting" and time.monotonic() >= worker.deadline:
                    worker.state = "dead"
                    worker.failure = f"not ready after {self.startup_timeout_s:.0f} s"
            failed = [w for w in self._workers if w.state == "dead"]
            if failed:
                self._closed = True
                self._finalizer()
                raise RewardWorkerError(
                    f"a scoring worker for {self.spec!r} failed to start:\n{failed[0].failure}"
                )

    def close(self) -> None:
        """Stop every worker (asking first, killing after 2 s); idempotent. Waits for a running call."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for worker in self._workers:
                with contextlib.suppress(OSError):
                    worker.inbox.close()  # EOF: an idle worker exits on its own
            deadline = time.monotonic() + 2.0
            for worker in self._workers:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            self._finalizer()

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers (for health checks and tests)."""
        return [w.proc.pid for w in self._workers if w.state != "dead"]

    def __enter__(self) -> ScorePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _replace(self, worker: _Worker) -> None:
        _kill(worker)
        with contextlib.suppress(OSError):  # read already (a timeout's stack); a dead worker cannot remove it
            os.unlink(worker.stack_path)
        index = self._workers.index(worker)
        self._workers[index] = self._spawn()
        self.restarts += 1

    # ---- one call ---------------------------------------------------------------------------------------

    def score(self, items: Sequence[AnyItem]) -> PoolResult:
        """Score every item; never raises because of an item. Thread-safe (calls are serialised)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the score pool is closed")
            self._items = items
            try:
                return self._run(items)
            finally:
                self._items = ()

    def _run(self, items: Sequence[AnyItem]) -> PoolResult:
        start, restarts = time.perf_counter(), self.restarts
        result = PoolResult([0.0] * len(items), [{} for _ in items], [ItemStatus.ERROR] * len(items))
        pending = deque(range(len(items)))
        for i, worker in enumerate(self._workers):  # slots whose replacement failed in an earlier call
            if worker.state == "dead":
                self._workers[i] = self._spawn()
        while pending or any(w.state == "busy" for w in self._workers):
            self._dispatch(pending, items, result)
            live = [w for w in self._workers if w.state != "dead"]
            if not live:
                for i in pending:
                    result.statuses[i] = ItemStatus.ERROR
                    result.reasons[i] = "no scoring worker could be started"
                break
            waiting = [w.deadline for w in live if w.state in ("busy", "starting")]
            timeout = max(0.0, min(waiting) - time.monotonic()) if waiting else None
            for conn in wait([w.outbox for w in live], timeout=timeout):
                self._on_message(next(w for w in live if w.outbox is conn), result)
            self._expire(result)
        result.elapsed_s = time.perf_counter() - start
        result.restarts = self.restarts - restarts
        return result

    def _dispatch(self, pending: deque[int], items: Sequence[AnyItem], result: PoolResult) -> None:
        for worker in self._workers:
            while worker.state == "idle" and pending:
                index = pending.popleft()
                try:
                    payload = pickle.dumps((index, tuple(items[index])), protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as err:
                    result.reasons[index] = f"cannot be sent to a scoring worker: {type(err).__name__}: {err}"
                    self._log(
                        "errors",
                        "reward item %d cannot be sent to a worker:\n%s",
                        index,
                        traceback.format_exc(),
                    )
                    result.statuses[index] = ItemStatus.ERROR
                    continue
                try:
                    worker.inbox.send_bytes(payload)
                except OSError:  # it died while idle: retry the item on its replacement
                    pending.appendleft(index)
                    self._replace(worker)
                    break
                worker.state = "busy"
                worker.item = index
                worker.deadline = time.monotonic() + self.timeout_s

    def _on_message(self, worker: _Worker, result: PoolResult | None) -> None:
        try:
            message = worker.outbox.recv()
        except (EOFError, OSError):
            self._on_death(worker, result)
            return
        if worker.state == "starting":
            if message[0] == "ready":
                worker.state = "idle"
            else:
                worker.state = "dead"
                worker.failure = str(message[1])
                if result is not None:
                    logger.error("a replacement scoring worker failed to start:\n%s", worker.failure)
            return
        if result is None or worker.state != "busy":
            return
        index, kind = message[0], message[1]
        if kind == "ok":
            result.scores[index], result.extras[index] = message[2], message[3]
            result.statuses[index] = ItemStatus.OK
            if message[4]:
                self._log("ignored", "score function returned non-numeric keys %s (not metrics)", message[4])
        else:
            source = self._items[index].data_source if index < len(self._items) else "?"
            lines = str(message[2]).strip().splitlines()
            result.reasons[index] = lines[-1] if lines else "the score function raised"
            self._log("errors", "reward function raised on item %d (%r):\n%s", index, source, message[2])
        worker.state = "idle"
        worker.item = -1

    def _on_death(self, worker: _Worker, result: PoolResult | None) -> None:
        code = worker.proc.poll()
        if worker.state == "busy" and result is not None:
            result.statuses[worker.item] = ItemStatus.ERROR
            result.reasons[worker.item] = f"the scoring worker exited with code {code} while scoring it"
            message = "scoring worker pid %d exited with code %s while scoring item %d"
            self._log("crashes", message, worker.proc.pid, code, worker.item)
        if worker.state == "starting":
            worker.state = "dead"
            worker.failure = f"exited with code {code} before it was ready"
            if result is not None:
                logger.error("a replacement scoring worker %s", worker.failure)
            _kill(worker)
            return
        self._replace(worker)

    def _expire(self, result: PoolResult) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.deadline > now or worker.state not in ("busy", "starting"):
                continue
            if worker.state == "starting":
                worker.state = "dead"
                worker.failure = f"not ready after {self.startup_timeout_s:.0f} s"
                logger.error("a replacement scoring worker was %s", worker.failure)
                _kill(worker)
                continue
            result.statuses[worker.item] = ItemStatus.TIMEOUT
            result.reasons[worker.item] = f"the score function passed reward.timeout_s={self.timeout_s:g}"
            if "timeouts" not in self._log.seen:
                self._log(
                    "timeouts",
                    "reward function passed timeout_s=%.3g on item %d (%r); worker pid %d killed. Stack:\n%s",
                    self.timeout_s,
                    worker.item,
                    self._items[worker.item].data_source,
                    worker.proc.pid,
                    _dump_stack(worker),
                )
            self._replace(worker)


def _pickled(function: ScoreFn) -> bytes:
    """The function pickled by value where needed (lambdas, closures, `__main__`), for the workers."""
    import cloudpickle

    try:
        return bytes(cloudpickle.dumps(function, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as err:
        raise RewardFunctionError(
            f"the reward function {function!r} cannot be pickled for the scoring workers: "
            f"{type(err).__name__}: {err}. Fix: do not capture open files, locks, sockets or models in it; "
            "create such objects inside the function (once, cached in a module-level variable)"
        ) from err


def _send_quietly(inbox: Connection, payload: bytes) -> None:
    """Send the pickled function; a worker that died first is the pool's to notice (EOF on its outbox)."""
    with contextlib.suppress(OSError):
        inbox.send_bytes(payload)


def _dump_stack(worker: _Worker, wait_s: float = 0.3) -> str:
    """Ask faulthandler in the worker for its stack (SIGUSR1) and read it back; best effort."""
    if not hasattr(signal, "SIGUSR1"):
        return "(no stack on this platform)"
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(worker.proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + wait_s
    text = ""
    while not text and time.monotonic() < deadline:
        time.sleep(0.01)
        with contextlib.suppress(OSError), open(worker.stack_path) as f:
            text = f.read()
    if text:  # the dump is written by a C signal handler in a few writes: let it finish
        time.sleep(0.02)
        with contextlib.suppress(OSError), open(worker.stack_path) as f:
            text = f.read()
    return text or "(the worker did not dump its stack)"
