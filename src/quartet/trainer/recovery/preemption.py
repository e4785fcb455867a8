"""Preemption: SIGTERM (or SLURM's early SIGUSR1) becomes a checkpoint and a clean exit within a grace.

    guard = Preemption(grace_s=120, exit_code=75)
    guard.install()                      # in the driver's main thread; False when off (grace 0) or not main
    ... at a step boundary: if guard.requested: save the step, stop the loop, exit with guard.exit_code
    guard.close()                        # the run's end (the workers stopped): the previous handlers back

Schedulers preempt by signalling the job and killing it after a grace (Kubernetes: SIGTERM, then SIGKILL after
`terminationGracePeriodSeconds`; SLURM: SIGTERM then SIGKILL after `GraceTime`/`KillWait`, and with
`--signal=B:USR1@N` a SIGUSR1 N seconds before the end). The driver of `quartet train` turns the first of
them into a save of the step it is on and an exit with `trainer.preempt_exit_code` (75, EX_TEMPFAIL: "try
again", the code a requeue rule matches); `trainer.resume=auto` continues from that checkpoint.

The signal handler does no work: it appends the signal number to a list and writes one byte to a pipe
(both safe in a handler: no lock, no allocation that can deadlock). The loop reads `requested` at its safe
points (`quartet.trainer.loop.rl_trainer`): after a completed step, or at the next phase boundary of the
running step when that step cannot finish within the grace (`step_fits`, from the measured step and save
times) and no role update began (the step is then abandoned: the roles still hold the last completed step,
whose state is saved; an update that began is always let finish, a half-updated step has no checkpoint).

A watchdog thread reads the pipe: after the first signal it waits for a second one or the end of the grace,
whichever comes first, then logs one line (naming the grace and what stays `latest`) and ends the process
with `os._exit(exit_code)`, even if the main thread is stuck in a step, a save or the workers' shutdown. A
save cut short by it leaves `latest` on the previous checkpoint: the checkpoint writer moves `latest` only
after the new folder is complete (`quartet.trainer.recovery.checkpoint`). `close` (the last thing a run's
session closes, after the workers stopped) disarms both, so a library caller's process is never ended
after `RLTrainer.run` returned; what remains of `quartet train` then is its return.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = ["PREEMPT_SIGNALS", "Preemption", "PreemptionNotice", "StepAbandoned"]

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""SIGTERM: Kubernetes, SLURM (at the end and on preemption), `kill`. SIGUSR1: SLURM's `--signal=B:USR1@N`
warning, forwarded to the driver by the batch script."""
_CLOSE = b"c"
_SIGNAL = b"s"


class StepAbandoned(BaseException):
    """Raised at a phase boundary of a step that cannot finish within the grace (no role update began).

    A BaseException so that no `except Exception` on the way (retries, healing) swallows it."""


@dataclass(frozen=True)
class PreemptionNotice:
    """What the run reports about a preemption: the signal, and the step boundary it was turned into."""

    signal: str
    grace_s: float
    exit_code: int


class Preemption:
    """The driver's preemption signals turned into a flag, and the grace turned into a hard deadline.

    exit_fn: how the watchdog ends the process (`os._exit`; a test passes a recorder).
    """

    def __init__(self, grace_s: float, exit_code: int, exit_fn: Callable[[int], Any] = os._exit) -> None:
        self.grace_s = grace_s
        self.exit_code = exit_code
        self.exit_fn = exit_fn
        self.signals: list[int] = []
        self.received_at: float | None = None
        """`time.monotonic()` when the first signal came (set by the watchdog, not the handler)."""
        self.saving_step: int | None = None
        """The step whose checkpoint is being written for the preemption, while it is."""
        self.saved_step: int = 0
        """The run's newest checkpoint (`latest`), kept up to date by the loop for the watchdog's line."""
        self.saved = False
        """The preemption's checkpoint is written (or there was none to write)."""
        self.fired: str | None = None
        """Why the watchdog ended the process ("grace" or "second signal"); set just before `exit_fn`."""
        self._previous: dict[int, Any] = {}
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None

    # ---- the handler and its pipe -------------------------------------------------------------------------

    def install(self) -> bool:
        """Handle SIGTERM and SIGUSR1 from now on; False (nothing changed) when the grace is 0 or this is
        not the main thread (Python delivers signals to the main thread only)."""
        if self.grace_s <= 0 or threading.current_thread() is not threading.main_thread():
            return False
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # a handler never blocks on a full pipe
        self._pipe = (read_fd, write_fd)
        self._thread = threading.Thread(target=self._watch, name="quartet-preempt", daemon=True)
        self._thread.start()
        self.claim()
        return True

    def claim(self) -> None:
        """The handlers ours again where something replaced them since `install` (`ray.init` sets its own
        SIGTERM handler, `sys.exit`); what replaced them is what `close` puts back."""
        if self._pipe is None:
            return
        for sig in PREEMPT_SIGNALS:
            if signal.getsignal(sig) != self._handle:
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: a flag and a byte, nothing else."""
        self.signals.append(signum)
        self._poke(_SIGNAL)

    def _poke(self, byte: bytes) -> None:
        if self._pipe is not None:
            with suppress(OSError):  # a full or closed pipe: the watchdog has what it needs already
                os.write(self._pipe[1], byte)

    def close(self) -> None:
        """The run is over (its workers stopped): the previous handlers back, the watchdog stopped."""
        if self._pipe is None:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        self._poke(_CLOSE)
        if self._thread is not None:
            self._thread.join(timeout=5)
        for fd in self._pipe:
            os.close(fd)
        self._pipe = None

    # ---- what the loop asks -------------------------------------------------------------------------------

    @property
    def requested(self) -> bool:
        """A preemption signal came: the loop saves at its next safe point and stops."""
        return bool(self.signals)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signals[0]).name if self.signals else ""

    def left_s(self) -> float:
        """Seconds of the grace left (the whole grace before any signal)."""
        if self.received_at is None:  # no signal yet, or the watchdog is about to note its time
            return self.grace_s
        return self.grace_s - (time.monotonic() - self.received_at)

    def step_fits(self, elapsed_s: float, step_s: float | None, save_s: float) -> bool:
        """Whether the running step (`elapsed_s` into it) can finish and be saved within the grace left,
        from the last measured step time `step_s` (None: none measured in this process; the step is let
        finish, the watchdog still bounds the exit) and save time `save_s`."""
        if step_s is None:
            return True
        return max(step_s - elapsed_s, 0.0) + save_s <= self.left_s()

    def notice(self) -> PreemptionNotice:
        return PreemptionNotice(self.signal_name, self.grace_s, self.exit_code)

    # ---- the watchdog -------------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Wait for the first signal; then for a second or the end of the grace, and end the process."""
        assert self._pipe is not None
        read_fd = self._pipe[0]
        if os.read(read_fd, 1) != _SIGNAL:
            return  # closed: a run that was not preempted
        self.received_at = time.monotonic()
        deadline = self.received_at + self.grace_s
        why = "grace"
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([read_fd], [], [], left)
            if ready:
                if os.read(read_fd, 1) == _CLOSE:
                    return  # the run ended (saved, workers stopped) within the grace
                why = "second signal"
                break
        self._end(why)

    def _end(self, why: str) -> None:
        """The one line (on stderr), then the exit: the save is abandoned (if it was still going)."""
        self.fired = why
        latest = f"global_step_{self.saved_step}" if self.saved_step else "absent (no checkpoint yet)"
        if self.saved:
            what = "after the preemption's checkpoint was written (the shutdown did not end in time)"
        elif self.saving_step is not None:
            what = f"before the checkpoint of step {self.saving_step} was written: abandoned"
        else:
            what = "before a step boundary was reached: nothing saved"
        cause = (
            f"a second {self.signal_name or 'signal'} came"
            if why == "second signal"
            else f"the grace of {self.grace_s:g} s (trainer.preempt_grace_s) ran out"
        )
        line = f"preemption: {cause} {what}; latest is {latest}; exiting with {self.exit_code}\n"
        with suppress(OSError):  # straight to the descriptor: no logging lock a stuck thread may hold
            os.write(2, line.encode())
        flush = threading.Thread(target=_flush_streams, daemon=True)  # a stuck stream must not hold the exit
        flush.start()
        flush.join(timeout=2.0)
        self.exit_fn(self.exit_code)


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):  # a closed stream: nothing to flush
            stream.flush()
