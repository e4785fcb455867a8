"""Admission of requests into the engine: open or closed (asleep), and a count of those inside.

The server closes the gate to sleep: new requests are refused at once, and `wait_idle` returns when the
requests already inside have left the engine (finished, or aborted after a timeout). A request counts as
inside until the engine is done with it, not until its caller gave up, so the engine is idle when the count
is zero and may be put to sleep.
"""

from __future__ import annotations

import asyncio
import threading
import time

from quartet.serving.errors import ServerAsleepError

__all__ = ["AdmissionGate"]


class AdmissionGate:
    """Admission of requests into the engine: open or closed (asleep), and how many are inside.

    Thread-safe, because in-process agent loops may call `generate_tokens` from their own threads and event
    loops; `wait_idle` therefore polls instead of waiting on an event bound to one loop.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = True
        self._inside = 0

    def enter(self) -> None:
        """Count a request in, or raise `ServerAsleepError` when closed."""
        with self._lock:
            if not self._open:
                raise ServerAsleepError()
            self._inside += 1

    def leave(self) -> None:
        """Count a request out (it left the engine)."""
        with self._lock:
            self._inside -= 1

    def set_open(self, is_open: bool) -> None:
        """Admit requests (True) or refuse them (False); those inside are not affected."""
        with self._lock:
            self._open = is_open

    @property
    def is_open(self) -> bool:
        """True while requests are admitted."""
        return self._open

    @property
    def inside(self) -> int:
        """Requests admitted that have not left the engine yet."""
        return self._inside

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait until no request is inside; TimeoutError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self._inside > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self._inside} request(s) still in the engine after {timeout_s:g} s")
            await asyncio.sleep(0.005)
