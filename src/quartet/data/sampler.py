"""Which prompts each step trains on: seeded epochs, and a position that a checkpoint can restore.

Epoch e visits the rows in the order `numpy.random.default_rng(seed + e).permutation(n)` (or 0..n-1 without
shuffling) and serves them `batch_size` at a time. The whole state is (epoch, position in the epoch's
order): the order of an epoch is recomputed from the seed, never stored, so a state dict is a few integers
and a resumed run draws exactly the batch the interrupted run would have drawn next. After the last batch
of an epoch the state moves to (epoch + 1, 0) at once, so a checkpoint taken at an epoch boundary says
plainly that the next batch starts a new epoch.

With `drop_last` (the default) the `n % batch_size` rows left at the end of an epoch's order are not used
in that epoch; every batch has the same size, which the rollout's per-rank split relies on. They are other
rows in the next epoch's order, so no row is left out for good.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["PromptSampler", "SamplerStateError"]


class SamplerStateError(ValueError):
    """A saved sampler state that does not fit this sampler (another dataset size, batch size or seed)."""


class PromptSampler:
    """Endless batches of row indices over epochs; see the module docstring."""

    def __init__(
        self, dataset_size: int, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if dataset_size < batch_size and drop_last:
            raise ValueError(
                f"the dataset has {dataset_size} prompts, fewer than one batch of {batch_size}: no batch "
                "could ever be drawn; lower data.train_batch_size or add data"
            )
        if dataset_size < 1:
            raise ValueError("the dataset is empty")
        self.dataset_size = dataset_size
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self._epoch = 0
        self._position = 0
        self._order_epoch = -1
        self._order = np.zeros(0, dtype=np.int64)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (0-based)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Rows of the current epoch's order already served."""
        return self._position

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.dataset_size, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def _epoch_rows(self) -> int:
        """Rows served per epoch."""
        return self.steps_per_epoch * self.batch_size if self.drop_last else self.dataset_size

    def order(self, epoch: int) -> np.ndarray:
        """The order in which epoch `epoch` visits the rows (int64, a permutation of 0..n-1)."""
        if not self.shuffle:
            return np.arange(self.dataset_size, dtype=np.int64)
        return np.random.default_rng(self.seed + epoch).permutation(self.dataset_size).astype(np.int64)

    def next_indices(self) -> list[int]:
        """The next batch of row indices (moving on to the next epoch after its last batch)."""
        if self._order_epoch != self._epoch:
            self._order = self.order(self._epoch)
            self._order_epoch = self._epoch
        stop = min(self._position + self.batch_size, self._epoch_rows)
        indices = [int(i) for i in self._order[self._position : stop]]
        self._position = stop
        if self._position >= self._epoch_rows:
            self._epoch = self._epoch + 1
            self._position = 0
        return indices

    def __iter__(self) -> Iterator[list[int]]:
        """Batches forever (the trainer decides when to stop)."""
        while True:
            yield self.next_indices()

    def state_dict(self) -> dict[str, Any]:
        """The position, and what it is only valid for (plain ints and bools: JSON- and torch-savable)."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "dataset_size": self.dataset_size,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state` (from `state_dict`); refuse a state of a differently built sampler, whose
        position would point into another order of rows."""
        mine = self.state_dict()
        keys = ("dataset_size", "batch_size", "shuffle", "seed", "drop_last")
        different = {k: (state[k], mine[k]) for k in keys if k in state and state[k] != mine[k]}
        if different:
            listing = ", ".join(f"{k}: saved {a}, now {b}" for k, (a, b) in different.items())
            raise SamplerStateError(
                f"the saved data position belongs to another sampler ({listing}); resume with the same data "
                "and data.train_batch_size / data.shuffle / data.seed, or start a new run"
            )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self._epoch_rows:
            raise SamplerStateError(f"invalid saved data position: epoch {epoch}, position {position}")
        if position == self._epoch_rows:  # a state saved at the very end of an epoch
            epoch, position = epoch + 1, 0
        self._epoch = epoch
        self._position = position
