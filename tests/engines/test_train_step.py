"""train_step: accumulated gradients equal one big batch's, non-finite steps are skipped, lr schedule."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_cases import make_batch, pg_loss, seq_mean_loss, unpadded_rows

from quartet.config.model import Dtype
from quartet.config.optim import LrSchedule, OptimConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.optim import build_scheduler
from quartet.models.loading import load_causal_lm

PROMPTS = [5, 2, 7, 1, 4, 6, 3]
RESPONSES = [3, 6, 1, 4, 0, 5, 2]
# eps >> |grad| makes Adam's first step lr * g / eps: proportional to the gradient, so a wrongly scaled or
# weighted gradient shows in the parameters (with the usual eps the first step is about lr * sign(g)).
SENSITIVE = OptimConfig(lr=0.5, eps=1.0, weight_decay=0.0, grad_clip=0.0)


def _engine(path: Path, optim: OptimConfig = SENSITIVE, **kw: object) -> TrainingEngine:
    return TrainingEngine(
        EngineSpec(str(path), ModelKind.CAUSAL_LM, Dtype.FLOAT32, optim=optim, **kw)  # type: ignore[arg-type]
    )


def _reference_step(
    path: Path, batch: Batch, per_row_loss: str
) -> tuple[dict[str, torch.Tensor], float, float]:
    """Plain transformers model, one unpadded row at a time, summed loss, AdamW step: (params, norm, loss)."""
    model = load_causal_lm(path)
    n_tok = int((batch["response_mask"] != 0).sum())
    n_seq = int((batch["response_mask"] != 0).any(-1).sum())
    total = torch.zeros(())
    for i, (ids, pl, rl) in enumerate(unpadded_rows(batch)):
        if rl == 0:
            continue
        logp = torch.log_softmax(model(ids[None]).logits[0, pl - 1 : pl + rl - 1], dim=-1)
        lp = logp.gather(1, ids[pl:, None]).squeeze(1)
        row = -(batch["advantages"][i, :rl] * lp)
        total = total + (row.sum() / n_tok if per_row_loss == "token" else row.mean() / n_seq)
    total.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), math.inf)
    torch.optim.AdamW(model.parameters(), lr=SENSITIVE.lr, eps=SENSITIVE.eps, weight_decay=0.0).step()
    return {k: v.detach() for k, v in model.state_dict().items()}, float(norm), float(total.detach())


@pytest.mark.parametrize(
    "micro", [MicroSpec(size=100), MicroSpec(size=1), MicroSpec(size=3), MicroSpec(max_tokens=9)]
)
@pytest.mark.parametrize("loss", ["token", "seq"])
def test_accumulated_update_equals_one_big_batch(tiny_model_dir: Path, micro: MicroSpec, loss: str) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    ref_params, ref_norm, ref_loss = _reference_step(tiny_model_dir, batch, loss)
    engine = _engine(tiny_model_dir)
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    loss_fn: Callable[..., object] = pg_loss if loss == "token" else seq_mean_loss
    metrics = engine.train_step(batch, loss_fn, micro)  # type: ignore[arg-type]
    assert metrics["grad_norm"] == pytest.approx(ref_norm, rel=1e-5)
    assert metrics["loss"] == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
    after = engine.module.state_dict()
    moved = max(float((after[k] - before[k]).abs().max()) for k in after)
    assert moved > 1e-3  # the step did something measurable
    for k, v in after.items():
        torch.testing.assert_close(v, ref_params[k], atol=1e-6, rtol=1e-5, msg=k)


def test_metrics_of_a_step(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, OptimConfig(lr=1e-3, warmup_steps=2))
    batch = make_batch(PROMPTS, RESPONSES)
    first = engine.train_step(batch, pg_loss, MicroSpec(size=3))
    second = engine.train_step(batch, pg_loss, MicroSpec(size=3))
    assert first["lr"] == 0.0 and second["lr"] == pytest.approx(5e-4)  # linear warmup from 0
    assert first["micro_batches"] == 3.0
    assert first["mb_rows"] == pytest.approx((3 + 3 + 1) / 3)  # loss_fn metrics: mean over micro-batches
    assert engine.steps == 2 and first["skipped_steps"] == 0.0


def test_non_finite_gradient_skips_the_step(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, OptimConfig(lr=1e-2))
    batch = make_batch(PROMPTS, RESPONSES)
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}

    def nan_loss(outputs, mb, scale):  # type: ignore[no-untyped-def]
        loss, metrics = pg_loss(outputs, mb, scale)
        return loss * float("nan"), metrics

    metrics = engine.train_step(batch, nan_loss, MicroSpec(size=4))
    assert math.isnan(metrics["grad_norm"])
    assert metrics["skipped_steps"] == 1.0 and engine.skipped_steps == 1
    for k, v in engine.module.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in engine.module.parameters())
    assert not engine.optimizer.state  # type: ignore[union-attr]  # Adam moments untouched
    ok = engine.train_step(batch, pg_loss, MicroSpec(size=4))  # the next finite step trains again
    assert math.isfinite(ok["grad_norm"]) and engine.skipped_steps == 1
    assert any(not torch.equal(v, before[k]) for k, v in engine.module.state_dict().items())


def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir: Path) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    plain = _engine(tiny_model_dir)
    ckpt = _engine(tiny_model_dir, gradient_checkpointing=True)
    a = plain.train_step(batch, pg_loss, MicroSpec(size=3))
    b = ckpt.train_step(batch, pg_loss, MicroSpec(size=3))
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)
    for (k, v), w in zip(plain.module.state_dict().items(), ckpt.module.state_dict().values(), strict=True):
        torch.testing.assert_close(v, w, atol=1e-7, rtol=0, msg=k)


def test_bf16_mixed_precision_trains_float32_master_weights(tiny_model_dir: Path) -> None:
    engine = TrainingEngine(
        EngineSpec(str(tiny_model_dir), ModelKind.CAUSAL_LM, Dtype.BFLOAT16, optim=OptimConfig(lr=1e-3))
    )
    metrics = engine.train_step(make_batch(PROMPTS, RESPONSES), pg_loss, MicroSpec(size=4))
    assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in engine.module.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in engine.optimizer.state.values())  # type: ignore[union-attr]


def _lr_curve(cfg: OptimConfig, total: int) -> list[float]:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    sched = build_scheduler(opt, cfg, total)
    out = []
    for _ in range(total):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_warmup_then_cosine_to_the_floor() -> None:
    cfg = OptimConfig(lr=1.0, warmup_steps=4, schedule=LrSchedule.COSINE, min_lr_ratio=0.1)
    curve = _lr_curve(cfg, 14)
    expected = [s / 4 for s in range(4)] + [
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 4) / 10)) for s in range(4, 14)
    ]
    assert curve == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(
    ("warmup", "total", "min_ratio"), [(0, 10, 0.0), (4, 14, 0.1), (3, 3, 0.5), (5, 2, 0.2)]
)
def test_the_schedules_equal_transformers_own(warmup: int, total: int, min_ratio: float) -> None:
    """quartet computes the factors itself (importing transformers' schedules imports peft): bit for bit
    the same as transformers' constant and cosine-with-min-lr schedules, past the end too."""
    from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

    def curve(make: Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LambdaLR]) -> list[float]:
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.3)
        sched, out = make(opt), []
        for _ in range(total + 3):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out

    cosine = OptimConfig(lr=0.3, warmup_steps=warmup, schedule=LrSchedule.COSINE, min_lr_ratio=min_ratio)
    ours = curve(lambda o: build_scheduler(o, cosine, total))
    assert ours == curve(
        lambda o: get_cosine_with_min_lr_schedule_with_warmup(o, warmup, total, min_lr_rate=min_ratio)
    )
    constant = OptimConfig(lr=0.3, warmup_steps=warmup)
    assert curve(lambda o: build_scheduler(o, constant, total)) == curve(
        lambda o: get_constant_schedule_with_warmup(o, warmup)
    )


def test_warmup_then_constant() -> None:
    curve = _lr_curve(OptimConfig(lr=2.0, warmup_steps=2), 5)
    assert curve == pytest.approx([0.0, 1.0, 2.0, 2.0, 2.0])
