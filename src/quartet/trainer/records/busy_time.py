"""Busy time of the two pools within a step's wall-clock window, and the time both were busy: the step's
`timing_s/trainer_idle`, `timing_s/rollout_idle` and `perf/overlap` are computed here and nowhere else.

Intervals are (start, end) wall-clock seconds (`time.time()`, comparable across processes of one machine
and, with synchronised clocks, across nodes). The step window is (start, end) too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["Interval", "busy_outside", "busy_seconds", "clip", "merged", "overlap_seconds", "pool_metrics"]

Interval = tuple[float, float]


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    """The parts of `intervals` inside `window` (empty ones dropped)."""
    lo, hi = window
    out = [(max(a, lo), min(b, hi)) for a, b in intervals]
    return [(a, b) for a, b in out if b > a]


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of `intervals` as sorted disjoint intervals."""
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def busy_seconds(intervals: Iterable[Interval], window: Interval) -> float:
    """Seconds of `window` covered by at least one interval."""
    return sum(b - a for a, b in merged(clip(intervals, window)))


def overlap_seconds(first: Iterable[Interval], second: Iterable[Interval], window: Interval) -> float:
    """Seconds of `window` during which both `first` and `second` had an interval running."""
    a_list, b_list = merged(clip(first, window)), merged(clip(second, window))
    total = 0.0
    i = 0
    j = 0
    while i < len(a_list) and j < len(b_list):
        lo = max(a_list[i][0], b_list[j][0])
        hi = min(a_list[i][1], b_list[j][1])
        total += max(0.0, hi - lo)
        if a_list[i][1] < b_list[j][1]:
            i += 1
        else:
            j += 1
    return total


def busy_outside(waits: Iterable[Interval], window: Interval) -> list[Interval]:
    """The parts of `window` outside every wait: the trainer is busy whenever it is not waiting for
    generation."""
    busy, cursor = [], window[0]
    for began, ended in sorted(waits):
        busy.append((cursor, began))
        cursor = max(cursor, ended)
    busy.append((cursor, window[1]))
    return busy


def pool_metrics(
    trainer_busy: Sequence[Interval], rollout_busy: Sequence[Interval], window: Interval
) -> dict[str, float]:
    """`timing_s/trainer_idle`, `timing_s/rollout_idle` and `perf/overlap` (share of the window when both
    pools worked) of one step."""
    wall = max(window[1] - window[0], 1e-9)
    trainer = busy_seconds(trainer_busy, window)
    rollout = busy_seconds(rollout_busy, window)
    return {
        "timing_s/trainer_idle": wall - trainer,
        "timing_s/rollout_idle": wall - rollout,
        "perf/overlap": overlap_seconds(trainer_busy, rollout_busy, window) / wall,
    }
