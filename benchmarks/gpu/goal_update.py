"""Step b of issue 37's GPU script: the actor update's MFU at the Qwen2-1.5B shape.

Qwen2-1.5B's shape with its FULL vocabulary (151,936; random weights built on the device, saved in bf16 once),
the training engine as the actor uses it: fp32 master weights, bf16 autocast, packed micro-batches
(`remove_padding`), no offload, entropy computed for the metric. 64 rows of 128 prompt + 512 response tokens,
micro-batches of 16 rows. MFU = 6 x params x tokens / update seconds over the measured bf16 matmul rate.
Packed attention runs as one varlen kernel call a layer where the device has one (`varlen_kernel_calls` in
each case counts them), and once more span by span (`update/varlen_kernel=off`) for the difference.
Where the engine has the fused log-prob/entropy head (`EngineSpec.fused_head`, detected at run time) the
update runs with it on and off.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any

import torch
from checks import random_batch, response_nll
from goal_decode import TINY, VOCAB, build_model
from goal_io import Step, log, matmul_rate

from quartet.engines.varlen_kernel import set_varlen_kernel, varlen_kernel_calls, varlen_kernel_off

SHAPE_1_5B = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                  intermediate_size=8960, tie_word_embeddings=True)  # fmt: skip


def has_fused_head() -> bool:
    """Whether this quartet's engine has the fused log-prob/entropy head switch."""
    from quartet.engines import EngineSpec

    return "fused_head" in {f.name for f in dataclasses.fields(EngineSpec)}


def timed_updates(
    step: Step, engine: Any, batch: Any, micro: int, **kwargs: Any
) -> tuple[list[float], list[float]]:
    """Three synchronised `train_step`s of `response_nll` on `batch`: their seconds and losses."""
    from quartet.engines import MicroSpec

    times, losses = [], []
    for _ in range(3):
        step.sync()
        t0 = time.perf_counter()
        out = engine.train_step(batch, response_nll, MicroSpec(size=micro), temperature=1.0, **kwargs)
        step.sync()
        times.append(time.perf_counter() - t0)
        losses.append(round(float(out["loss"]), 5))
    return times, losses


def update_case(step: Step, model_dir: str, fused: bool | None, peak: float) -> dict[str, Any]:
    """Three optimizer steps (the first warms up); tokens/s and MFU of the best of the last two."""
    from quartet.config.model import Dtype
    from quartet.config.optim import OptimConfig
    from quartet.engines import EngineSpec, TrainingEngine

    rows, prompt, response, micro = (4, 8, 16, 2) if step.dry_run else (64, 128, 512, 16)
    extra: dict[str, Any] = {} if fused is None else {"fused_head": fused}
    precision = Dtype.BFLOAT16 if step.cuda else Dtype.FLOAT32
    spec = EngineSpec(model_dir, mixed_precision=precision, optim=OptimConfig(lr=1e-6), remove_padding=True,
                      **extra)  # fmt: skip
    if step.cuda:
        torch.cuda.reset_peak_memory_stats()
    engine = TrainingEngine(spec)
    kernel_calls = varlen_kernel_calls()
    module: Any = engine.module
    batch = random_batch(rows, prompt, response, int(module.config.vocab_size))
    times, losses = timed_updates(step, engine, batch, micro, with_entropy=True, entropy_grad=False)
    params = sum(p.numel() for p in engine.module.parameters())
    tokens = rows * (prompt + response)
    best = min(times[1:])
    result = {
        "fused_head": fused,
        "rows": rows,
        "tokens": tokens,
        "micro_batch_rows": micro,
        "params": params,
        "losses": losses,
        "step_seconds": [round(t, 4) for t in times],
        "tokens_per_s": round(tokens / best, 1),
        "tflops": round(6 * params * tokens / best / 1e12, 3),
        "mfu": round(6 * params * tokens / best / peak, 4),
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if step.cuda else None,
        "varlen_kernel_calls": varlen_kernel_calls() - kernel_calls,
        "varlen_kernel_off": varlen_kernel_off(),
    }
    try:  # the profile is extra: its failure must not lose the timed case
        result["profile"] = update_profile(step, engine, batch, micro)
    except Exception as err:
        result["profile"] = {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:1000]}
    del engine
    gc.collect()
    if step.cuda:
        torch.cuda.empty_cache()
    return result


def update_profile(step: Step, engine: Any, batch: Any, micro: int) -> dict[str, Any]:
    """One more update under the profiler: device time by kind of kernel (`kernel_kinds`) and the ten
    largest kernels. On CUDA the kernels' own rows (an aten op's row repeats its kernels' time); in a CPU
    dry run, the aten ops' self times."""
    from kernel_kinds import by_kind
    from torch.profiler import ProfilerActivity, profile

    from quartet.engines import MicroSpec

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if step.cuda else [])
    step.sync()
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        engine.train_step(batch, response_nll, MicroSpec(size=micro), temperature=1.0, with_entropy=True,
                          entropy_grad=False)  # fmt: skip
        step.sync()
    wall = time.perf_counter() - t0
    key = "self_device_time_total" if step.cuda else "self_cpu_time_total"
    device = "CUDA" if step.cuda else "CPU"
    events = [e for e in prof.key_averages() if e.device_type.name == device and getattr(e, key, 0) > 0]
    rows = [(e.key, float(getattr(e, key)), int(e.count)) for e in events]
    rows.sort(key=lambda r: -r[1])
    return {
        "sorted_by": key,
        "wall_s": round(wall, 4),
        **by_kind(rows),
        "top": [{"name": n[:90], "us": round(us, 1), "calls": c} for n, us, c in rows[:10]],
    }


def run(step: Step) -> None:
    peak = matmul_rate(step)
    step.put("matmul_flops_per_s", round(peak))
    t0 = time.perf_counter()
    model = build_model(step, TINY if step.dry_run else SHAPE_1_5B, 1000 if step.dry_run else VOCAB)
    model_dir = step.work / "qwen2-1.5b-shape"
    model.save_pretrained(model_dir)
    del model
    gc.collect()
    if step.cuda:
        torch.cuda.empty_cache()
    step.put("model_build_s", round(time.perf_counter() - t0, 2))
    variants: list[bool | None] = [True, False] if has_fused_head() else [None]
    step.put("fused_head_switch", has_fused_head())
    for fused in variants:
        key = "update" if fused is None else f"update/fused_head={str(fused).lower()}"
        if not step.fits(key, 40.0):
            continue
        try:
            step.put(key, update_case(step, str(model_dir), fused, peak))
        except Exception as err:  # the other variant may still run (an OOM without the fused head, say)
            step.put(key, {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
            gc.collect()
            if step.cuda:
                torch.cuda.empty_cache()
    # the same update with packed attention span by span: what the varlen kernel gives (engines.varlen_kernel)
    key = "update/varlen_kernel=off"
    if step.fits(key, 40.0):
        set_varlen_kernel(False)
        try:
            off = update_case(step, str(model_dir), variants[0], peak)
            on = step.record.get(
                "update" if variants[0] is None else f"update/fused_head={str(variants[0]).lower()}"
            )
            if isinstance(on, dict) and on.get("losses"):  # the same first step: the kernel's numbers agree
                gap = abs(on["losses"][0] - off["losses"][0]) / max(abs(off["losses"][0]), 1e-12)
                off["first_loss_gap_vs_kernel"] = round(gap, 6)
            step.put(key, off)
        except Exception as err:
            step.put(key, {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
        finally:
            set_varlen_kernel(True)
    log("update: done")
