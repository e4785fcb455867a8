"""Which waiting sequences join the running batch, and in what order (first come, first served).

A request's samples are admitted together so their prompt is prefilled once (prefix sharing); a request
with more samples than the engine has slots is split into groups of at most `max_num_seqs`. Admission is
strictly in arrival order: a group that does not fit yet blocks the ones behind it, so a large request is
never starved by a stream of small ones.
"""

from __future__ import annotations

from collections import deque

from quartet.rollout.torch.sequence import SequenceGroup, SequenceState

__all__ = ["Scheduler", "split_into_groups"]


def split_into_groups(sequences: list[SequenceState], max_group: int) -> list[SequenceGroup]:
    """The samples of one request in groups of at most `max_group` (all share one request)."""
    request = sequences[0].request
    return [SequenceGroup(request, sequences[i : i + max_group]) for i in range(0, len(sequences), max_group)]


class Scheduler:
    """The queue of sequence groups waiting for free slots."""

    def __init__(self, max_prefill_tokens: int) -> None:
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[SequenceGroup] = deque()

    def __len__(self) -> int:
        return len(self.waiting)

    def add(self, groups: list[SequenceGroup]) -> None:
        """Queue groups behind those already waiting."""
        self.waiting.extend(groups)

    def admit(self, free_slots: int) -> list[SequenceGroup]:
        """Pop the groups that start now: in order, while they fit the free slots and the prefill budget.

        The budget bounds the padded prefill batch (groups x longest prompt), hence its attention mask; the
        first group is always admitted when it has slots, however long its prompt.
        """
        admitted: list[SequenceGroup] = []
        longest = 0
        while self.waiting:
            group = self.waiting[0]
            need = len(group.sequences)
            longest_if = max(longest, group.prompt_len)
            over_budget = admitted and (len(admitted) + 1) * longest_if > self.max_prefill_tokens
            if need > free_slots or over_budget:
                break
            admitted.append(self.waiting.popleft())
            free_slots -= need
            longest = longest_if
        return admitted

    def abort(self, request_id: str) -> list[SequenceGroup]:
        """Remove and return the waiting groups of `request_id`."""
        removed = [g for g in self.waiting if g.request.request_id == request_id]
        if removed:
            self.waiting = deque(g for g in self.waiting if g.request.request_id != request_id)
        return removed
