"""Issue 54 item 1 on the device: decode with and without the fused Triton kernels (`rollout.fused_kernels`).

Two parts, each recorded as it ends:
- `kernels/*`: each kernel against its torch path at the 7B shape (hidden 3584, 28 query and 4 key/value
  heads of 128, vocabulary 151,936) for 64 and 256 rows: device ms per call (CUDA events, the mean of 20
  after 3 warm-ups) and how far the outputs are (the largest difference; for the sampler the share of equal
  tokens and the largest log-prob difference); the sampler with and without top-k/top-p
  (its ranked and vocabulary-order paths); which Triton ran and which kernels `select_kernels` kept;
- `0.5B/64`, `7B/64`: the built-in engine's decode (CUDA graphs) with `fused_kernels=off` and `auto`,
  ms per step each and the speedup, as `goal_decode.engine_case` measures it.

On a CPU (`goals.py --dry-run`) the kernels are not timed (they run on CUDA; tests/rollout_kernels checks
them under Triton's interpreter) and the engine cases run at tiny sizes with both settings (the torch path
twice), which proves the step's code runs.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from goal_decode import SHAPES, TINY, VOCAB, build_model, engine_case
from goal_io import Step, log

ROWS = (64, 256)
NEW = 128
SHAPE_7B = (3584, 28, 4, 128)  # hidden, query heads, key/value heads, head dim


def _device_ms(fn: Callable[[], Any], repeats: int = 20) -> float:
    """Mean device milliseconds of `fn` (CUDA events around `repeats` calls after 3 warm-ups)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()  # type: ignore[no-untyped-call]
    for _ in range(repeats):
        fn()
    end.record()  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / repeats, 4)  # type: ignore[no-untyped-call]


def compare(ours: Any, theirs: Any) -> dict[str, float]:
    """How far a kernel's output is from its torch path's: the largest difference of each output tensor
    (the sampler: the share of equal tokens and the largest log-prob difference)."""
    if isinstance(ours, tuple) and ours[0].dtype == torch.int64:  # (tokens, log-probs)
        return {
            "tokens_equal": round(float((ours[0] == theirs[0]).float().mean()), 4),
            "logprob_max_diff": float((ours[1] - theirs[1]).abs().max()),
        }
    pairs = zip(ours, theirs, strict=True) if isinstance(ours, tuple) else [(ours, theirs)]
    return {"max_abs_diff": max(float((x.float() - y.float()).abs().max()) for x, y in pairs)}


def kernel_cases(
    rows: int,
    device: torch.device,
    shape: tuple[int, int, int, int] = SHAPE_7B,
    vocab: int = VOCAB,
) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """(Triton, torch) callables of each kernel at `shape` (hidden, heads, kv heads, head dim), `vocab` and
    `rows` rows, in bf16 on `device` (the GPU; tests run them on the CPU under Triton's interpreter)."""
    from quartet.rollout.torch.kernels.rms_norm import add_rms_norm_torch, add_rms_norm_triton
    from quartet.rollout.torch.kernels.rope_cache import rope_cache_torch, rope_cache_triton, signed_sin
    from quartet.rollout.torch.kernels.sampler import sample_torch, sample_triton
    from quartet.rollout.torch.sampling import RowSampling

    torch.manual_seed(0)  # the same inputs every run (CPU and CUDA generators)
    dev, bf16 = device, torch.bfloat16
    hidden, heads, kv_heads, head_dim = shape
    capacity = 512
    x, res = (torch.randn(rows, 1, hidden, device=dev, dtype=bf16) for _ in "xr")
    weight = torch.randn(hidden, device=dev, dtype=bf16)
    q = torch.randn(rows, 1, heads, head_dim, device=dev, dtype=bf16).transpose(1, 2)
    k, v = (torch.randn(rows, 1, kv_heads, head_dim, device=dev, dtype=bf16).transpose(1, 2) for _ in "kv")
    cos = torch.randn(rows, 1, 1, head_dim, device=dev, dtype=bf16)
    sin = signed_sin(torch.randn(rows, 1, 1, head_dim, device=dev, dtype=bf16))
    k_cache = torch.zeros(rows, kv_heads, head_dim, capacity, device=dev, dtype=bf16)
    v_cache = torch.zeros(rows, kv_heads, capacity, head_dim, device=dev, dtype=bf16)
    lengths = torch.randint(0, capacity, (rows,), device=dev)
    logits = torch.randn(rows, vocab, device=dev, dtype=bf16) * 3
    uniforms = torch.rand(rows, device=dev)

    def sampling(filtered: bool) -> RowSampling:
        return RowSampling(
            temperature=torch.full((rows,), 0.9, device=dev),
            top_k=torch.full((rows,), 50 if filtered else 0, device=dev),
            top_p=torch.full((rows,), 0.95 if filtered else 1.0, device=dev),
            any_filter=filtered,
            any_greedy=False,
            all_greedy=False,
        )

    rope = (q, k, v, cos, sin, k_cache, v_cache, lengths)
    plain, filtered = sampling(False), sampling(True)
    return {
        "add_rms_norm": (
            lambda: add_rms_norm_triton(x, res, weight, 1e-6),
            lambda: add_rms_norm_torch(x, res, weight, 1e-6),
        ),
        "rope_cache": (lambda: rope_cache_triton(*rope), lambda: rope_cache_torch(*rope)),
        "sample": (
            lambda: sample_triton(logits, plain, uniforms),
            lambda: sample_torch(logits, plain, uniforms),
        ),
        "sample_top_k_top_p": (
            lambda: sample_triton(logits, filtered, uniforms),
            lambda: sample_torch(logits, filtered, uniforms),
        ),
    }


def kernels_part(step: Step) -> None:
    """The selector's verdict and each kernel against its torch path (CUDA only)."""
    from quartet.rollout.torch.kernels import select_kernels, triton_missing

    missing = triton_missing()
    if missing is None:
        import triton

        step.put("triton", triton.__version__)
    else:
        step.put("triton", {"status": "skip", "reason": missing})
    if not step.cuda:
        reason = (
            "no CUDA: the kernels run on the device (tests/rollout_kernels checks them interpreted on CPU)"
        )
        step.put("kernels", {"status": "skip", "reason": reason})
        return
    chosen = select_kernels("auto", torch.device("cuda"))
    step.put("kernels/selected", sorted(chosen.triton) if chosen is not None else [])
    for rows in ROWS:
        try:
            cases = kernel_cases(rows, torch.device("cuda"))
            record = {}
            for name, (fused, reference) in cases.items():
                agreement = compare(fused(), reference())
                ours, theirs = _device_ms(fused), _device_ms(reference)
                record[name] = {
                    "triton_ms": ours,
                    "torch_ms": theirs,
                    "speedup": round(theirs / ours, 3) if ours else None,
                    **agreement,
                }
            step.put(f"kernels/{rows}", record)
        except Exception as err:  # a kernel that fails here must not lose the engine cases
            step.put(f"kernels/{rows}", {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})


def run(step: Step) -> None:
    """The kernels, then the engine at 0.5B and 7B with 64 rows: fused kernels off and auto, and auto with
    4 tokens a graph replay (`rollout.graph_decode_steps`)."""
    kernels_part(step)
    vocab, new, rows = (1000, 8, 4) if step.dry_run else (VOCAB, NEW, 64)
    for name, estimate in (("0.5B", 28.0), ("7B", 62.0)):
        if not step.fits(f"{name}/64", estimate):
            continue
        try:
            model = build_model(step, TINY if step.dry_run else SHAPES[name], vocab)
            off = engine_case(step, model, rows, new, vocab, profile=False, fused_kernels="off")
            on = engine_case(step, model, rows, new, vocab, profile=False, fused_kernels="auto")
            speedup = round(off["ms_per_step"] / on["ms_per_step"], 3)
            blocks = engine_case(
                step, model, rows, new, vocab, profile=False, fused_kernels="auto", graph_decode_steps=4
            )
            over_auto = round(on["ms_per_step"] / blocks["ms_per_step"], 3)
            step.put(
                f"{name}/64",
                {
                    "off": off,
                    "auto": on,
                    "speedup": speedup,
                    "auto_4_steps": blocks,
                    "4_steps_over_auto": over_auto,
                },
            )
        except Exception as err:  # (out of memory, say) the other size may still run
            step.put(f"{name}/64", {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
        model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    log("decode_kernels: done")
