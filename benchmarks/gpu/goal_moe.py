"""Step `moe` of the GPU script (issue 49): a Qwen3-MoE of a realistic small shape, decoded by the built-in
engine and updated by the training engine, with the expert matmul transformers picked recorded.

The shape: hidden 1024, 12 layers, 64 experts of width 512, 8 per token (16 heads of 64, 4 KV heads), the full
vocabulary (151,936): 1.40B parameters, 0.34B active per token. Built from a config on the device in bf16
(random weights, nothing downloads).

- `experts`: which experts forward ran. transformers 5 dispatches a Qwen3-MoE's experts
  (`@use_experts_implementation`) to `config._experts_implementation`: `grouped_mm` by default where
  `_grouped_mm_can_dispatch` allows it (one grouped matmul over every expert's tokens), else `eager` (a loop
  over the experts hit); `batched_mm` on request. Inside `grouped_mm`, `torch.nn.functional.grouped_mm` (torch
  >= 2.10) or `torch._grouped_mm` runs where the device and dtype allow, else transformers' own fallback (a
  loop). The step asks for `grouped_mm` where this torch has a grouped matmul and records the setting and the
  function one forward actually called.
- `decode/64`: the built-in engine's decode at 64 rows (32-token random prompts, 256 sampled tokens, CUDA
  graphs; where the graph capture fails, the failure and an eager run instead): ms/step and tokens/s.
- `update`: the training engine as the actor uses it (fp32 master weights, bf16 autocast, packed, no offload,
  the router's load-balancing loss at Qwen3-MoE's 0.001): 3 optimizer steps on 32 rows of 128 + 512 tokens,
  micro-batches of 8 rows; step seconds, tokens/s, MFU by active parameters (6 x active x tokens / the best
  step's time, over a bf16 matmul rate measured in this step), and the peak device memory
  (`torch.cuda.max_memory_allocated`; on the CPU of a dry run, the resident set's peak growth).

A dry run does the same on the CPU at tiny sizes (hidden 64, 2 layers, 8 experts, top 2) in float32.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import torch
from checks import random_batch
from goal_decode import NEW, VOCAB, engine_case
from goal_io import Step, log, matmul_rate
from goal_update import timed_updates

SHAPE = {"hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16, "num_key_value_heads": 4,
         "head_dim": 64, "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
         "intermediate_size": 2816, "tie_word_embeddings": True}  # fmt: skip
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "intermediate_size": 128, "tie_word_embeddings": True}  # fmt: skip
ROWS = 64


def grouped_mm_function() -> str | None:
    """The grouped matmul this torch has (`torch.nn.functional.grouped_mm`, else `torch._grouped_mm`)."""
    if hasattr(torch.nn.functional, "grouped_mm"):
        return "torch.nn.functional.grouped_mm"
    return "torch._grouped_mm" if hasattr(torch, "_grouped_mm") else None


def build_moe(step: Step, shape: dict[str, Any], vocab: int) -> Any:
    """A random Qwen3-MoE of `shape` on the device in the compute dtype, its experts on `grouped_mm` where
    this torch has a grouped matmul (else transformers' pick)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=vocab, max_position_embeddings=1024, bos_token_id=None,
                            eos_token_id=None, pad_token_id=0, **shape)  # fmt: skip
    if grouped_mm_function() is not None:
        config._experts_implementation = "grouped_mm"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if step.cuda else torch.float32)
    try:
        torch.manual_seed(0)
        with torch.device(step.device):
            model: Any = Qwen3MoeForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def experts_ran(model: Any, device: str) -> dict[str, Any]:
    """The experts implementation of `model`'s config and the grouped matmuls one short forward called
    (counted by wrapping torch's functions for its duration; `grouped_mm_called`: the outermost, None when
    none was: eager, batched, or transformers' fallback loop)."""
    calls: dict[str, int] = {}
    homes = [(torch.nn.functional, "grouped_mm", "torch.nn.functional.grouped_mm"),
             (torch, "_grouped_mm", "torch._grouped_mm")]  # fmt: skip
    saved = [(home, attr, label, getattr(home, attr)) for home, attr, label in homes if hasattr(home, attr)]

    def counting(label: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[label] = calls.get(label, 0) + 1
            return fn(*args, **kwargs)

        return wrapped

    try:
        for home, attr, label, fn in saved:
            setattr(home, attr, counting(label, fn))
        with torch.no_grad():
            model(input_ids=torch.randint(5, 100, (2, 16), device=device))
    finally:
        for home, attr, _, fn in saved:
            setattr(home, attr, fn)
    return {
        "experts_implementation": model.config._experts_implementation,
        "grouped_mm_available": grouped_mm_function(),
        "grouped_mm_called": next(iter(calls), None),  # the first counted: the wrapper counts, then calls
        "grouped_mm_calls_per_forward": calls,
    }


def param_counts(model: Any) -> tuple[int, int]:
    """(total, active per token): the active count leaves out the experts a token is not routed to."""
    cfg = model.config
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    idle = (cfg.num_experts - cfg.num_experts_per_tok) / cfg.num_experts
    return total, total - round(experts * idle)


def decode_case(step: Step, model: Any, rows: int, new: int, vocab: int) -> dict[str, Any]:
    """The built-in engine's decode, CUDA graphs on; where the capture fails, the failure and an eager run."""
    try:
        return {"cuda_graphs": step.cuda, **engine_case(step, model, rows, new, vocab, profile=False)}
    except Exception as err:
        if not step.cuda:
            raise
        failure = f"{type(err).__name__}: {err}"[:1500]
    _free(step)
    case = engine_case(step, model, rows, new, vocab, profile=False, cuda_graphs=False)
    return {"cuda_graphs": False, "cuda_graphs_failure": failure, **case}


def update_case(step: Step, model_dir: str, active: int, peak_flops: float) -> dict[str, Any]:
    """Three optimizer steps of the training engine; the first allocates Adam's states and warms up."""
    from quartet.config.model import Dtype
    from quartet.config.optim import OptimConfig
    from quartet.engines import EngineSpec, TrainingEngine
    from quartet.planning.measure import current_rss_bytes, peak_rss_bytes, reset_peak_rss

    rows, prompt, response, micro = (4, 8, 16, 2) if step.dry_run else (32, 128, 512, 8)
    precision = Dtype.BFLOAT16 if step.cuda else Dtype.FLOAT32
    spec = EngineSpec(model_dir, mixed_precision=precision, optim=OptimConfig(lr=1e-6), remove_padding=True,
                      moe_aux_loss_coef=0.001)  # fmt: skip
    if step.cuda:
        torch.cuda.reset_peak_memory_stats()
    before = current_rss_bytes()
    reset_peak_rss()
    engine = TrainingEngine(spec)
    module: Any = engine.module
    batch = random_batch(rows, prompt, response, int(module.config.vocab_size))
    times, losses = timed_updates(step, engine, batch, micro)
    tokens = rows * (prompt + response)
    best = min(times[1:])
    result = {
        "rows": rows,
        "tokens": tokens,
        "micro_batch_rows": micro,
        "experts_implementation": module.config._experts_implementation,
        "losses": losses,
        "step_seconds": [round(t, 4) for t in times],
        "tokens_per_s": round(tokens / best, 1),
        "mfu_active": round(6 * active * tokens / best / peak_flops, 4),
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if step.cuda else peak_rss_bytes() - before,
        "peak_memory_kind": "cuda max_memory_allocated" if step.cuda else "RSS peak growth (CPU)",
    }
    del engine, module
    _free(step)
    return result


def _free(step: Step) -> None:
    gc.collect()
    if step.cuda:
        torch.cuda.empty_cache()


def run(step: Step) -> None:
    """The experts' implementation, the decode, then the update, each recorded as it ends."""
    vocab, new, rows = (1000, 8, 4) if step.dry_run else (VOCAB, NEW, ROWS)
    peak_flops = matmul_rate(step)
    step.put("matmul_flops_per_s", round(peak_flops))
    t0 = time.perf_counter()
    model = build_moe(step, TINY if step.dry_run else SHAPE, vocab)
    total, active = param_counts(model)
    step.put("shape", {**(TINY if step.dry_run else SHAPE), "vocab_size": vocab, "params": total,
                       "active_params": active, "dtype": str(next(model.parameters()).dtype)})  # fmt: skip
    step.put("experts", experts_ran(model, step.device))
    step.put("build_s", round(time.perf_counter() - t0, 2))
    if step.fits(f"decode/{ROWS}", 30.0):
        try:
            step.put(f"decode/{ROWS}", decode_case(step, model, rows, new, vocab))
        except Exception as err:  # the update may still run
            step.put(f"decode/{ROWS}", {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
    model_dir = step.work / "qwen3-moe"
    model.save_pretrained(model_dir)
    del model
    _free(step)
    if step.fits("update", 45.0):
        try:
            step.put("update", update_case(step, str(model_dir), active, peak_flops))
        except Exception as err:
            step.put("update", {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
    log("moe: done")
