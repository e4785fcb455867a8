"""Issue 54's FP8 rollout on the device (`rollout.quantization=fp8`; step `fp8_decode` of `goals.py`).

Two parts, each recorded as it ends:
- `scaled_mm`: at the 7B projections' shapes (q/o 3584x3584, k/v 512x3584, gate/up 18944x3584, down
  3584x18944) and 64 / 256 rows, the `Fp8Linear` forward on the device (per-token fp8 activations x
  per-channel fp8 weights through `torch._scaled_mm`) against `scaled_reference`, its float32 twin (relative
  error), whether the scaled path ran, and the time of the bf16 `F.linear`, the fp8 forward, its activation
  quantization alone and the scaled matmul alone (a launch-bound op is timed 20 calls at a time).
- `7B/64`, `7B/256`: the built-in engine's decode of the 7B shape (random weights, full vocabulary, CUDA
  graphs; as `goal_decode`) with its projections in fp8, in ms per step, against the bf16 roofline (every
  bf16 parameter's bytes + the KV read a step, over the measured HBM bandwidth: the issue's goal is to go
  below it) and against the fp8 roofline (the same with the fp8 weights' bytes and scales).

On the CPU (`--dry-run`, the kit's CI run) `scaled_mm` is skipped (no CUDA) and the decode runs the
emulation (dequantize, then matmul) at the tiny shape: the code path, not a figure.
"""

from __future__ import annotations

import gc
from typing import Any

import torch
import torch.nn.functional as F
from goal_decode import PROMPT, SHAPES, TINY, VOCAB, build_model, engine_case, roofline
from goal_io import Step, hbm_bandwidth, log, timed

PROJECTIONS_7B = {"q_o": (3584, 3584), "k_v": (3584, 512), "gate_up": (3584, 18944), "down": (18944, 3584)}
"""(in, out) of the 7B shape's projections."""
REPEAT = 20


def _per_call_ms(step: Step, fn: Any) -> float:
    """Median ms of one call of `fn`, timed `REPEAT` calls at a time (5 times)."""
    times = timed(step, lambda: [fn() for _ in range(REPEAT)], 5)
    return round(1000 * sorted(times)[len(times) // 2] / REPEAT, 4)


def _projection_case(step: Step, linear: torch.nn.Linear, x: torch.Tensor) -> dict[str, Any]:
    """One projection shape at one row count: errors of the fp8 forward and the times of its parts."""
    from quartet.rollout.torch.fp8 import Fp8Linear, quantize_tokens, scaled_reference

    module = Fp8Linear.from_linear(linear)
    with torch.inference_mode():
        got = module(x).float()
        want = scaled_reference(x, module.weight, module.weight_scale).float()
        exact = F.linear(x.float(), linear.weight.float())
        xq, xs = quantize_tokens(x)
        w_t, w_s = module.weight.t(), module.weight_scale.unsqueeze(0)
        case: dict[str, Any] = {
            "path": "scaled_mm" if module.scaled else "emulated",
            "rel_err_vs_reference": round(float((got - want).norm() / want.norm()), 6),
            "rel_err_vs_bf16_weights": round(float((got - exact).norm() / exact.norm()), 6),
            "bf16_linear_ms": _per_call_ms(step, lambda: F.linear(x, linear.weight)),
            "fp8_forward_ms": _per_call_ms(step, lambda: module(x)),
            "quantize_tokens_ms": _per_call_ms(step, lambda: quantize_tokens(x)),
        }
        if module.scaled:
            case["scaled_mm_only_ms"] = _per_call_ms(
                step, lambda: torch._scaled_mm(xq, w_t, scale_a=xs, scale_b=w_s, out_dtype=torch.bfloat16)
            )
    return case


def scaled_mm_case(step: Step) -> dict[str, Any]:
    """The device's scaled fp8 product against its float32 twin and against bf16, per 7B projection shape."""
    from quartet.rollout.torch.fp8 import scaled_mm_supported

    if not step.cuda:
        return {"status": "skip", "reason": "no CUDA device: the CPU runs the emulation (tests/rollout_fp8)"}
    device = torch.device(step.device)
    out: dict[str, Any] = {
        "capability": ".".join(map(str, torch.cuda.get_device_capability(device))),
        "scaled_mm_supported": scaled_mm_supported(device),
    }
    torch.manual_seed(0)
    for name, (fan_in, fan_out) in PROJECTIONS_7B.items():
        linear = torch.nn.Linear(fan_in, fan_out, bias=False, device=device, dtype=torch.bfloat16)
        for rows in (64, 256):
            x = torch.randn(rows, fan_in, device=device, dtype=torch.bfloat16)
            out[f"{name}/{rows}"] = _projection_case(step, linear, x)
    return out


def _weight_bytes(model: Any) -> int:
    """Bytes of the model's weights as they are held: parameters, plus fp8 codes and scales (buffers named
    `weight` or `weight_scale`; the rotary embedding's buffers are not weights)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    fp8 = sum(
        b.numel() * b.element_size()
        for n, b in model.named_buffers()
        if n.endswith((".weight", ".weight_scale"))
    )
    return params + fp8


def run(step: Step) -> None:
    """The scaled-matmul check, then the 7B decode in fp8 at 64 and 256 rows."""
    from quartet.rollout.torch.fp8 import Fp8Linear, quantize_layers
    from quartet.rollout.torch.model_runner import DecoderRunner

    vocab, new = (1000, 8) if step.dry_run else (VOCAB, 256)
    rows_of = {64: 4, 256: 8} if step.dry_run else {64: 64, 256: 256}
    bandwidth = hbm_bandwidth(step)
    step.put("hbm_bytes_per_s", round(bandwidth))
    try:
        step.put("scaled_mm", scaled_mm_case(step))
    except Exception as err:  # the decode below still runs
        step.put("scaled_mm", {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
    if not step.fits("7B/engine", 40.0):
        return
    model = build_model(step, TINY if step.dry_run else SHAPES["7B"], vocab)
    unquantized = {rows: roofline(model, rows, PROMPT, new, bandwidth) for rows in rows_of.values()}
    count = quantize_layers(DecoderRunner(model).layers)
    modules = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    fp8_bytes = _weight_bytes(model)
    step.put(
        "7B/quantized",
        {
            "projections": count,
            "path": "scaled_mm" if all(m.scaled for m in modules) else "emulated",
            "unquantized_weight_bytes": unquantized[rows_of[64]]["weight_bytes"],
            "fp8_weight_bytes": fp8_bytes,
        },
    )
    for rows in (64, 256):
        key = f"7B/{rows}"
        try:
            case = engine_case(step, model, rows_of[rows], new, vocab, profile=False)
            line = unquantized[rows_of[rows]]
            fp8_ms = 1000 * (fp8_bytes + line["kv_bytes_per_step"]) / bandwidth
            case |= {
                "kv_bytes_per_step": line["kv_bytes_per_step"],
                "bf16_roofline_ms": line["roofline_ms"],
                "fp8_roofline_ms": round(fp8_ms, 4),
                "ratio_to_bf16_roofline": round(case["ms_per_step"] / line["roofline_ms"], 3),
                "ratio_to_fp8_roofline": round(case["ms_per_step"] / fp8_ms, 3),
            }
            step.put(key, case)
        except Exception as err:  # a failed case must not hide the next one
            step.put(key, {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
    del model
    gc.collect()
    log("fp8_decode: done")
