"""Per-rank state across a change of world size: which saved rank's file a rank of the new world reads.

A checkpoint's model and optimizer are one global state that torch.distributed.checkpoint reshards onto any
world size or layout (dp, sp, tp, ep). What each rank keeps of its own cannot always be carried:

- global values every rank holds alike (the scheduler's position, the step counters, the actor's update
  count) are read from the saved rank of the same number, else from saved rank 0: exact;
- per-rank random streams (torch's RNG, a role's shuffling generator): rank r of the new world takes saved
  rank r's stream where it exists; a rank that did not exist is seeded from `derived_seed(seed, step, r)`,
  and the streams of saved ranks past the new world are dropped. Only these are not carried exactly.

`elastic_source` says which file a rank reads and whether its random streams are its own; `describe_change`
is the one line a resume logs about it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ElasticSource", "derived_seed", "describe_change", "elastic_source", "saved_ranks"]


def derived_seed(seed: int, step: int, rank: int, stream: str = "torch") -> int:
    """A seed for rank `rank`'s random stream `stream` ("torch": torch's RNG; a role names its own) when the
    checkpoint has none for it: a function of the run's seed, the step it resumes from, the rank and the
    stream only (so a second resume of the same checkpoint on the same world gets the same streams),
    spread by a hash so that neighbouring ranks, and two streams of one rank, are unrelated."""
    digest = hashlib.sha256(f"quartet-elastic:{stream}:{seed}:{step}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def saved_ranks(folder: Path, prefix: str) -> list[int]:
    """The ranks that wrote a `<prefix><r>.pt` file into `folder`, ascending."""
    pattern = re.compile(rf"{re.escape(prefix)}(\d+)\.pt")
    found = (pattern.fullmatch(p.name) for p in folder.glob(f"{prefix}*.pt"))
    return sorted(int(m.group(1)) for m in found if m is not None)


@dataclass(frozen=True)
class ElasticSource:
    """Where rank `rank` of the new world takes its per-rank state from."""

    path: Path
    """The file it reads: its own rank's, else saved rank 0's (global values only)."""
    own: bool
    """True when `path` is this rank's own file: its random streams are carried exactly."""
    saved_world: int


def elastic_source(folder: Path, prefix: str, rank: int) -> ElasticSource:
    """The per-rank file (`<prefix><r>.pt`) rank `rank` reads; raises FileNotFoundError naming the folder
    when no rank's file is there (not a checkpoint written by `save`)."""
    ranks = saved_ranks(folder, prefix)
    if not ranks:
        raise FileNotFoundError(f"{folder} holds no {prefix}<rank>.pt file: not a checkpoint save() wrote")
    if rank in ranks:
        return ElasticSource(folder / f"{prefix}{rank}.pt", True, len(ranks))
    return ElasticSource(folder / f"{prefix}{ranks[0]}.pt", False, len(ranks))


def describe_change(saved_world: int, world: int, what: str) -> str | None:
    """The line that says how `what` (e.g. "torch RNG") was carried from `saved_world` ranks onto `world`;
    None when the world is the same (everything carried exactly)."""
    if saved_world == world:
        return None
    fresh = list(range(saved_world, world))
    dropped = list(range(world, saved_world))
    parts = [f"world changed from {saved_world} to {world} rank(s)"]
    if fresh:
        parts.append(f"{what} of new ranks {fresh} seeded from (seed, step, rank)")
    if dropped:
        parts.append(f"{what} of saved ranks {dropped} dropped")
    parts.append("everything else carried exactly")
    return "; ".join(parts)
