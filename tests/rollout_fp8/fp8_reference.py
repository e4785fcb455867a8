"""Independent references of the fp8 tests: the format written out row by row, and a tiny model's decode."""

from __future__ import annotations

import torch
from torch import nn

FP8 = torch.float8_e4m3fn


def reference_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The format's definition, one row at a time in float32: scale = amax / 448 (1 for a zero row),
    code = e4m3(clamp(row / scale, +-448)) by torch's cast. Returns (codes as uint8 bits, scales)."""
    w = weight.detach().to(torch.float32)
    codes = torch.empty(w.shape, dtype=torch.uint8)
    scales = torch.empty(w.shape[0], dtype=torch.float32)
    for r in range(w.shape[0]):
        amax = w[r].abs().max()
        scale = amax / 448.0 if amax > 0 else torch.tensor(1.0)
        scales[r] = scale
        codes[r] = torch.clamp(w[r] / scale, -448.0, 448.0).to(FP8).view(torch.uint8)
    return codes, scales


def dequantized_copy(model: nn.Module, names: tuple[str, ...]) -> None:
    """Replace, in place, the weight of every `nn.Linear` named in `names` inside `model.model.layers` with
    what its fp8 rows stand for (reference_quantize, then codes x scale in float32): the model an fp8
    engine computes with, in plain linear layers."""
    layers: nn.Module = model.model.layers  # type: ignore[assignment]
    with torch.no_grad():
        for module_name, module in layers.named_modules():
            if module_name.rsplit(".", 1)[-1] in names and isinstance(module, nn.Linear):
                codes, scales = reference_quantize(module.weight)
                deq = codes.view(FP8).to(torch.float32) * scales.unsqueeze(1)
                module.weight.copy_(deq.to(module.weight.dtype))


def teacher_forced_logits(runner: object, prompts: list[list[int]], steps: int) -> list[torch.Tensor]:
    """Next-token logits [G, V] of the prefill and of `steps` decode steps of a `DecoderRunner`, each step
    feeding token (7 x step + row) % 97 + 3, the same whatever the model samples."""
    from quartet.rollout.torch.model_runner import DecoderRunner

    assert isinstance(runner, DecoderRunner)
    cache = runner.new_cache(len(prompts))
    cache.ensure_capacity(max(map(len, prompts)) + steps + 1, used=0)
    ids = torch.zeros(len(prompts), max(map(len, prompts)), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    lengths = torch.tensor([len(p) for p in prompts])
    with torch.inference_mode():
        out = [runner.prefill(ids, lengths, cache, 0, None).float()]
        for step in range(steps):
            tokens = (7 * step + torch.arange(len(prompts))) % 97 + 3
            out.append(runner.decode(tokens, lengths, int(lengths.max()) + 1, cache).float())
            lengths = lengths + 1
    return out
