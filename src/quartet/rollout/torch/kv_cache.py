"""A static, slot-based key/value cache for batched decoding.

Layout: per layer, keys [slots, kv_heads, head_dim, capacity] (stored transposed, so the decode step's
q @ K^T reads each slot's keys as an ordinary row-major matrix: about 1.8x faster than a transposed view on
CPU) and values [slots, kv_heads, capacity, head_dim]. Slot s holds one sequence from position 0 (no left
padding), so a sequence's next token goes to column `length[s]`, and its rotary position equals that
column. The engine keeps running sequences in slots 0..A-1 (compacted after each step), so a decode step
reads contiguous-slot views of the first L columns (L = longest running sequence) and no row is copied per
step. Written by hand because transformers' `DynamicCache` concatenates a new tensor per step and its
`StaticCache` shares one write position across the batch; neither lets sequences join and leave the batch
independently.
"""

from __future__ import annotations

import torch

__all__ = ["SlotKVCache"]

_CAPACITY_QUANTUM = 64  # grow in steps of whole blocks so a run of requests triggers few reallocations


class SlotKVCache:
    """Keys and values of up to `num_slots` sequences, for every layer."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    @property
    def allocated(self) -> bool:
        """True while buffers exist (False before the first request and after `free`)."""
        return bool(self.keys)

    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def ensure_capacity(self, tokens: int, used: int) -> None:
        """Make every slot hold at least `tokens` positions, keeping columns [0, used) of all slots.

        Grows to a multiple of 64 and at least 1.5x the old capacity, so growth is rare and amortised.
        """
        if tokens <= self.capacity and self.allocated:
            return
        new_cap = max(tokens, int(self.capacity * 1.5))
        new_cap = -(-new_cap // _CAPACITY_QUANTUM) * _CAPACITY_QUANTUM
        k_shape = (self.num_slots, self.num_kv_heads, self.head_dim, new_cap)
        v_shape = (self.num_slots, self.num_kv_heads, new_cap, self.head_dim)
        keys = [torch.zeros(k_shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        values = [torch.zeros(v_shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        if self.allocated and used > 0:
            for new, old in zip(keys, self.keys, strict=True):
                new[..., :used].copy_(old[..., :used])
            for new, old in zip(values, self.values, strict=True):
                new[:, :, :used].copy_(old[:, :, :used])
        self.keys = keys
        self.values = values
        self.capacity = new_cap

    def free(self) -> None:
        """Drop the buffers (sleep); the next `ensure_capacity` allocates them again."""
        self.keys = []
        self.values = []
        self.capacity = 0

    def write_prefill(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, start: int, expand: torch.Tensor | None
    ) -> None:
        """Store prompt keys/values [G, kv_heads, P, hd] in slots start.. (row `expand[i]` -> slot start+i).

        `expand` [S] int64 repeats a prompt's row into the slots of its n samples (prefix sharing: the
        prompt is computed once); None means one slot per row.
        """
        if expand is not None:
            key, value = key.index_select(0, expand), value.index_select(0, expand)
        rows, length = key.shape[0], key.shape[2]
        self.keys[layer][start : start + rows, ..., :length].copy_(key.transpose(2, 3))
        self.values[layer][start : start + rows, :, :length].copy_(value)

    def write_decode(
        self,
        layer: int,
        key: torch.Tensor,
        value: torch.Tensor,
        rows: torch.Tensor,
        column: torch.Tensor,
        length: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one new key/value per running slot and return the cached keys and values to attend to.

        key, value [A, kv_heads, 1, hd]; rows [A] int64 = arange(A); column [A] int64 (each row's write
        position); length = max(column) + 1. Returns views of slots 0..A-1: keys [A, kv_heads, hd, length]
        (transposed) and values [A, kv_heads, length, hd].
        (Indexed assignment rather than `scatter_`, which copies the whole cache slice for bfloat16 on CPU.)
        """
        k_cache, v_cache = self.keys[layer], self.values[layer]
        k_cache[rows, :, :, column] = key[:, :, 0]
        v_cache[rows, :, column] = value[:, :, 0]
        count = key.shape[0]
        return k_cache[:count, ..., :length], v_cache[:count, :, :length]

    def move(self, dst: list[int], src: list[int], length: int) -> None:
        """Copy columns [0, length) of slots `src` into slots `dst` (compaction after sequences finish)."""
        if not dst:
            return
        dst_t = torch.tensor(dst, device=self.device)
        src_t = torch.tensor(src, device=self.device)
        views = [k[..., :length] for k in self.keys] + [v[:, :, :length] for v in self.values]
        for view in views:
            view.index_copy_(0, dst_t, view.index_select(0, src_t))
