"""Named exceptions of weight sync; each message says what was expected, what was found, and where."""

from __future__ import annotations

__all__ = ["BackendUnavailableError", "GroupJoinError", "WeightSyncError"]


class BackendUnavailableError(RuntimeError):
    """The chosen collective backend cannot run here (for example NCCL on a CPU-only torch build)."""


class GroupJoinError(RuntimeError):
    """A weight-sync group could not be formed in time: a peer is missing, unreachable, or duplicated.

    `joined` is how many ranks had registered when the wait gave up (-1 when this rank could not even reach
    the sender's store, so the count is unknowable from here).
    """

    def __init__(self, address: str, world_size: int, joined: int, problem: str) -> None:
        self.address = address
        self.world_size = world_size
        self.joined = joined
        self.problem = problem
        count = f"{joined} of {world_size} ranks joined" if joined >= 0 else f"world size {world_size}"
        super().__init__(f"weight-sync group at {address} ({count}): {problem}")

    def __reduce__(self) -> tuple[type[GroupJoinError], tuple[str, int, int, str]]:
        """Pickle by the constructor's arguments (see `WeightSyncError.__reduce__`)."""
        return type(self), (self.address, self.world_size, self.joined, self.problem)


class WeightSyncError(RuntimeError):
    """One sync failed or timed out: a peer died or hung, the stream was aborted, or the wire data is bad.

    `version` is the weights version of the failed sync (None when a receiver failed before the version
    arrived), `stage` the step that failed (for example `bucket 3 payload`), `bytes_done` how many payload
    bytes had fully gone through before the failure.
    """

    def __init__(self, version: int | None, stage: str, bytes_done: int, problem: str) -> None:
        self.version = version
        self.stage = stage
        self.bytes_done = bytes_done
        self.problem = problem
        which = f"version {version}" if version is not None else "an unknown version (none arrived yet)"
        super().__init__(
            f"weight sync of {which} failed at {stage} after {bytes_done} payload bytes: {problem}"
        )

    def __reduce__(self) -> tuple[type[WeightSyncError], tuple[int | None, str, int, str]]:
        """Pickle by the constructor's arguments. The default pickles `args` (the one formatted message) and
        calls the four-argument constructor with it on load, which fails: an error raised in a Ray actor
        then reached the driver as `UnserializableException: Failed to deserialize exception` (the chaos
        soak's killed rollout replica) instead of naming the failed sync."""
        return type(self), (self.version, self.stage, self.bytes_done, self.problem)
