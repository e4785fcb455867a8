"""torch's fused AdamW as the engine's optimizer (`optim.fused`, auto: where the parameters allow it): the
same steps as the for-loop AdamW within float32 rounding, with the engine's weight-decay groups."""

from __future__ import annotations

import torch
from torch import nn

from quartet.config.optim import OptimConfig
from quartet.engines.optim import build_optimizer, fused_supported


def _module(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8))


def _steps(module: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 4) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 16, generator=gen)
        loss = module(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_auto_is_fused_on_cpu_and_steps_as_the_for_loop_does() -> None:
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1)
    fused_model, loop_model = _module(0), _module(0)
    fused = build_optimizer(fused_model, cfg)
    assert fused.defaults["fused"] is True
    loop = build_optimizer(loop_model, OptimConfig(lr=1e-2, weight_decay=0.1, fused=False))
    assert not loop.defaults["fused"]
    assert [g["weight_decay"] for g in fused.param_groups] == [0.1, 0.0]  # matrices decay, the rest not
    _steps(fused_model, fused)
    _steps(loop_model, loop)
    moved = 0.0
    for (name, a), b in zip(fused_model.named_parameters(), loop_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
        moved = max(moved, float((a.detach() - _module(0).state_dict()[name]).abs().max()))
    assert moved > 1e-3  # the steps did move the weights


def test_parameters_fused_adamw_cannot_take_fall_back() -> None:
    cpu = [nn.Parameter(torch.zeros(3))]
    assert fused_supported(cpu)
    assert not fused_supported([*cpu, nn.Parameter(torch.zeros(3, device="meta"))])  # two device kinds
    assert not fused_supported([nn.Parameter(torch.zeros(3, device="meta"))])
    ints = nn.Parameter(torch.zeros(3, dtype=torch.long), requires_grad=False)
    assert not fused_supported([*cpu, ints])
