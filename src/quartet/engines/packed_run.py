"""One micro-batch through the model packed into one sequence, with or without sequence parallelism.

The engine runs a micro-batch packed (`engines.packing`) when `model.remove_padding` is set, and always
under sequence parallelism (`model.sequence_parallel_size` > 1): a padded [b, T] batch cannot be cut by
tokens without splitting its padding unevenly, while the packed sequence of real tokens can. The packed
outputs equal the padded ones up to float rounding (tests/engines/test_packing.py), so packing under SP
changes nothing the user sees; `remove_padding: false` only means "padded when there is no SP".

`PackedRun` holds the packed micro-batch and this rank's share of it (`ulysses.local_share`: everything
without SP, its token slice with SP). Causal LMs read the head's outputs at the kept positions; the value
model reads its per-token value head at the same positions (value[t] is the output at the position whose
logits choose response token t, as on the padded path). Both are gathered over the sequence group and
scattered back into the [b, R'] layout the losses read.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from quartet.engines.fused_head import HeadRequest
from quartet.engines.head_outputs import run_head
from quartet.engines.inputs import ModelInputs
from quartet.engines.packing import PackedInputs, pack_inputs, pack_sharing
from quartet.engines.tensor_parallel import VocabHead
from quartet.engines.ulysses import SeqGroup, SeqShard, gather_outputs, local_share
from quartet.engines.vision_inputs import NO_VISION, VisionCall, packed_vision
from quartet.models.vision import image_token_mask

__all__ = ["PackedPlace", "PackedRun", "packed_logprobs", "packed_values"]


@dataclass(frozen=True)
class PackedRun:
    """A packed micro-batch and this rank's share of it."""

    packed: PackedInputs
    part: SeqShard
    device: torch.device

    @classmethod
    def of(
        cls, inputs: ModelInputs, group: SeqGroup | None, device: torch.device, share: bool = False
    ) -> PackedRun:
        """Pack `inputs` and take this rank's share (its token slice under SP). `share`: rows with the same
        prompt run it once (`engines.shared_prompts`; not under SP)."""
        shared = pack_sharing(inputs) if share and group is None else None
        packed = pack_inputs(inputs) if shared is None else shared
        return cls(packed, local_share(packed, group), device)

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the model's forward on this rank's tokens (attention reads the bounds)."""
        part, spans = self.part, self.packed.spans
        return {
            "input_ids": part.input_ids.to(self.device),
            "position_ids": part.position_ids.to(self.device),
            "use_cache": False,
            "quartet_bounds": part.bounds,
            **part.model_kwargs,
            **({} if spans is None else {"quartet_spans": spans.to(self.device)}),
        }

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """[1, K] outputs of the K response tokens -> [b, R'] (zeros elsewhere), differentiable."""
        where = self.packed.response_mask.to(values.device)
        return torch.zeros(where.shape, dtype=values.dtype, device=values.device).masked_scatter(
            where, values[0]
        )

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """[1, local K] outputs of this rank's slice -> [1, K] of the micro-batch (`gather_outputs`)."""
        group = self.part.group
        if group is None:
            return local
        return gather_outputs(local[0], self.part.counts, group).unsqueeze(0)


@dataclass(frozen=True)
class PackedPlace:
    """Where a packed pass runs: the sequence group, the device, the engine's autocast and a causal LM's
    head (the fused lm_head, or the vocabulary-parallel head, or neither: the plain logits)."""

    group: SeqGroup | None
    device: torch.device
    autocast: Callable[[], AbstractContextManager[Any]]
    lm_head: nn.Linear | None
    vocab: VocabHead | None
    share: bool = False
    """Rows with the same prompt run it once (`engines.shared_prompts`)."""


def packed_values(
    module: nn.Module, inputs: ModelInputs, place: PackedPlace, vision: VisionCall = NO_VISION
) -> torch.Tensor:
    """A value model's [b, R'] float32 values of one micro-batch, computed packed (split by tokens under SP).

    The value head runs on every local token (one scalar each, cheap); the values at the kept positions are
    gathered over the sequence group, so every rank of the group holds the micro-batch's values and the value
    loss aggregates exactly as without SP. `vision`: a VLM's images and positions of the padded micro-batch
    (`engines.vision_inputs`; vision-language models run without SP), packed here like the tokens. `place`:
    where it runs (its head fields unused)."""
    run = PackedRun.of(inputs, place.group, place.device, place.share)
    extra, slots, stand_in = packed_vision(vision, inputs.attention_mask)
    with place.autocast(), image_token_mask(slots, stand_in):
        token_values = module(**{**run.model_kwargs(), **extra}).logits  # [1, local n, 1]
    local = token_values[0, run.part.keep.to(place.device), 0].float().unsqueeze(0)  # [1, local K]
    return run.unpack(run.gather(local))


def packed_logprobs(
    module: nn.Module,
    inputs: ModelInputs,
    place: PackedPlace,
    head: tuple[float, bool, bool],
    vision: VisionCall = NO_VISION,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A causal LM's [b, R'] log-probs and entropy (None unless asked) of one micro-batch packed into one
    sequence (`quartet.engines.packing`): the outputs of the K real response tokens only, gathered over the
    sequence group and scattered back into the [b, R'] layout. `head` is (temperature, with_entropy,
    entropy_grad)."""
    run = PackedRun.of(inputs, place.group, place.device, place.share)  # with SP: this rank's token slice
    extra, slots, stand_in = packed_vision(vision, inputs.attention_mask)  # a VLM's (no SP)
    kwargs = {**run.model_kwargs(), **extra}

    def logits(fused: bool) -> torch.Tensor:  # [1, K, V], or [1, K, 2] from the fused head
        with place.autocast(), image_token_mask(slots, stand_in):
            out = module(logits_to_keep=run.part.keep.to(place.device), **kwargs)
        return out.logits  # type: ignore[no-any-return]

    targets = run.part.targets.to(place.device).unsqueeze(0)
    request = HeadRequest(targets, *head)
    logprobs, entropy = run.part.gather(*run_head(logits, request, place.lm_head, place.vocab))
    return run.unpack(logprobs), None if entropy is None else run.unpack(entropy)
