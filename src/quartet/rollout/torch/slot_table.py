"""Per-slot decoding state kept on the device, so a decode step needs no host-to-device copy.

Rows are slots (the same indexing as `SlotKVCache`); the engine moves rows with the cache when it
compacts the running batch.
"""

from __future__ import annotations

import torch

from quartet.rollout.torch.sampling import RowSampling, draw_uniforms
from quartet.rollout.torch.sequence import SequenceState

__all__ = ["SlotTable"]


class SlotTable:
    """Device tensors, one row per slot:

    cached_len [slots] int64: tokens in the KV cache (= position of the next token fed).
    last_token [slots] int64: newest sampled token, fed at the next decode step.
    generated [slots] int64: tokens sampled so far (index of the next uniform).
    temperature [slots] float32, top_k [slots] int64, top_p [slots] float32: sampling parameters.
    uniforms [slots, U] float32: each sequence's pre-drawn uniforms, one per token it may generate.
    """

    def __init__(self, num_slots: int, device: torch.device) -> None:
        self.num_slots = num_slots
        self.device = device
        self.cached_len = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.last_token = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.generated = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.temperature = torch.ones(num_slots, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.top_p = torch.ones(num_slots, dtype=torch.float32, device=device)
        self.uniforms = torch.zeros(num_slots, 0, dtype=torch.float32, device=device)

    def _columns(self) -> tuple[torch.Tensor, ...]:
        return (
            self.cached_len,
            self.last_token,
            self.generated,
            self.temperature,
            self.top_k,
            self.top_p,
            self.uniforms,
        )

    def assign(self, start: int, seqs: list[SequenceState]) -> None:
        """Fill slots start..start+len(seqs)-1 for newly admitted sequences (prompt cached, none sampled)."""
        stop = start + len(seqs)
        longest = max(s.max_new_tokens for s in seqs)
        if longest > self.uniforms.shape[1]:
            grown = torch.zeros(self.num_slots, longest, dtype=torch.float32, device=self.device)
            grown[:, : self.uniforms.shape[1]] = self.uniforms
            self.uniforms = grown
        params = [s.request.sampling for s in seqs]

        def put(t: torch.Tensor, values: list[float] | list[int]) -> None:
            t[start:stop] = torch.tensor(values, dtype=t.dtype).to(self.device, non_blocking=True)

        put(self.cached_len, [s.prompt_len for s in seqs])
        put(self.generated, [0] * len(seqs))
        put(self.temperature, [p.temperature for p in params])
        put(self.top_k, [p.top_k for p in params])
        put(self.top_p, [p.top_p for p in params])
        rows = torch.zeros(len(seqs), self.uniforms.shape[1], dtype=torch.float32)
        for i, s in enumerate(seqs):
            if not s.request.sampling.greedy:
                rows[i, : s.max_new_tokens] = draw_uniforms(s.seed, s.max_new_tokens)
        self.uniforms[start:stop] = rows.to(self.device, non_blocking=True)

    def move(self, dst: list[int], src: list[int]) -> None:
        """Copy rows `src` into rows `dst` (compaction)."""
        if not dst:
            return
        dst_t = torch.tensor(dst, device=self.device)
        src_t = torch.tensor(src, device=self.device)
        for col in self._columns():
            col.index_copy_(0, dst_t, col.index_select(0, src_t))

    def next_uniforms(self, start: int, stop: int) -> torch.Tensor:
        """The uniform each sequence in slots start..stop-1 uses for its next token [stop-start] float32."""
        if self.uniforms.shape[1] == 0:  # only greedy sequences so far
            return torch.zeros(stop - start, dtype=torch.float32, device=self.device)
        index = self.generated[start:stop].clamp(max=self.uniforms.shape[1] - 1).unsqueeze(1)
        return self.uniforms[start:stop].gather(1, index).squeeze(1)

    def next_uniforms_block(self, start: int, stop: int, steps: int) -> torch.Tensor:
        """The uniforms of slots start..stop-1 for their next `steps` tokens [stop-start, steps] float32
        (past a sequence's budget: its last one, for tokens it will drop)."""
        if self.uniforms.shape[1] == 0:  # only greedy sequences so far
            return torch.zeros(stop - start, steps, dtype=torch.float32, device=self.device)
        offsets = torch.arange(steps, device=self.device)
        index = (self.generated[start:stop].unsqueeze(1) + offsets).clamp(max=self.uniforms.shape[1] - 1)
        return self.uniforms[start:stop].gather(1, index)

    def sampling_rows(self, start: int, stop: int, seqs: list[SequenceState]) -> RowSampling:
        """Sampling parameters of slots start..stop-1, whose sequences are `seqs` (for the host flags)."""
        greedy = [s.request.sampling.greedy for s in seqs]
        return RowSampling(
            temperature=self.temperature[start:stop],
            top_k=self.top_k[start:stop],
            top_p=self.top_p[start:stop],
            any_filter=any(s.request.sampling.uses_filter for s in seqs),
            any_greedy=any(greedy),
            all_greedy=all(greedy),
        )

    def record_block(self, start: int, last: torch.Tensor, steps: int) -> None:
        """After `steps` tokens sampled and fed for slots start.. (`last` [n]: the newest of each)."""
        stop = start + last.shape[0]
        self.last_token[start:stop] = last
        self.generated[start:stop] += steps
        self.cached_len[start:stop] += steps

    def record(self, start: int, tokens: torch.Tensor, fed: bool) -> None:
        """Store `tokens` [n] sampled for slots start..; `fed`: the previous token entered the cache."""
        stop = start + tokens.shape[0]
        self.last_token[start:stop] = tokens
        self.generated[start:stop] += 1
        if fed:
            self.cached_len[start:stop] += 1
