"""The scoring worker process: `python -m quartet.rewards.worker SPEC IN_FD OUT_FD PARENT_PID STACK_FILE`.

It loads the score function from its spec (with the spec `pickled:`, the function is the first message
of its input pipe, pickled by the parent with cloudpickle: callables passed to `RLTrainer`), calls the
function's `warm_up()` when it has one (slow imports belong there, not in the first item's time limit),
says `("ready", pid)`, then answers each item `(seq, ScoreItem)` with `(seq, "ok", score, extras,
ignored)` or `(seq, "error", text)` until its input closes or it receives None. An exception in the
function is an answer, not a crash.

Safety nets, because the parent may kill it at any moment and may itself die:
- `faulthandler` dumps the Python stack to the stack file on SIGUSR1, so the parent can log where a
  timed-out call was stuck before killing it.
- A daemon thread exits the process when the parent is gone (re-parented): a worker stuck in a loop
  would otherwise outlive a crashed trainer. (PR_SET_PDEATHSIG is not used: it fires when the parent
  THREAD that started the worker exits, which is any short-lived thread of a Ray actor.)
- SIGINT is ignored: the parent decides when workers stop.

Only the standard library and the function's own imports are loaded, so a replacement starts in ~0.1 s.
(The default rule scorer's `warm_up` imports `quartet.tasks` for the built-in tasks, about a second.)
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from quartet.rewards.custom import PICKLED, load_function
from quartet.rewards.scoring import read_score


def _leave_nothing(stack_path: str) -> None:
    """Remove this worker's stack file, and the pool's temp folder once it is empty. A pool killed outright
    (SIGKILL) cannot remove that folder itself: its last worker to leave does, so nothing is left behind."""
    with contextlib.suppress(OSError):
        os.unlink(stack_path)
    with contextlib.suppress(OSError):  # not empty: another worker's file is still there
        os.rmdir(os.path.dirname(stack_path))


def _exit_when_orphaned(parent_pid: int, stack_path: str, period_s: float = 0.5) -> None:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(period_s)
        _leave_nothing(stack_path)
        os._exit(3)

    threading.Thread(target=watch, name="quartet-reward-parent-watch", daemon=True).start()


def _answer(fn: Any, seq: int, item: Any) -> tuple[Any, ...]:
    try:
        value = read_score(fn(*item))
    except BaseException:  # noqa: BLE001 - SystemExit from user code is an item error too
        return (seq, "error", traceback.format_exc())
    return (seq, "ok", value.score, value.extras, value.ignored)


def main(argv: list[str]) -> int:
    """Serve score requests until the input closes; the exit code is 0 on a clean stop."""
    spec, in_fd, out_fd, parent_pid, stack_path = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inbox = Connection(int(in_fd), writable=False)
    outbox = Connection(int(out_fd), readable=False)
    _exit_when_orphaned(int(parent_pid), stack_path)
    stack_file = open(stack_path, "w")  # noqa: SIM115 - must stay open for faulthandler
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=False)
    try:
        fn = pickle.loads(inbox.recv_bytes()) if spec == PICKLED else load_function(spec)
        warm_up = getattr(fn, "warm_up", None)
        if callable(warm_up):
            warm_up()
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        outbox.send(("fatal", traceback.format_exc()))
        return 1
    outbox.send(("ready", os.getpid()))
    while True:
        try:
            message = inbox.recv()
        except (EOFError, OSError):  # the pool closed, or its process is gone
            _leave_nothing(stack_path)
            return 0
        if message is None:
            _leave_nothing(stack_path)
            return 0
        seq, item = message
        outbox.send(_answer(fn, seq, item))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
