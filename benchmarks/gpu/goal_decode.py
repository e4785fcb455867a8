"""Step a of issue 37's GPU script: the built-in engine's decode against the memory roofline.

Random Qwen2 weights at the FULL vocabulary (151,936), built directly on the device in bf16 (no save, no
load: a 7B model initialised on the CPU takes minutes), 32-token prompts (random, so no prefix is shared),
256 sampled tokens a row, the engine's CUDA graphs on. Cases: 0.5B, then 7B, at 64 and 256
rows, a device profile of the 7B/64 decode (the kernels that remain). Then, as a step of its own
(`hf_baseline`), HF `generate` with a static cache (transformers compiles its decode forward on CUDA:
`reduce-overhead`) at 0.5B/64, the issue's baseline.

Roofline of one decode step = (every parameter's bytes + the KV bytes a step reads at the mean context) /
the measured HBM bandwidth (a device-to-device copy, bytes read + written). Parameters include the input
embedding (the issue's convention; its rows are gathered, not streamed, so the true floor is a bit lower:
`roofline_ms_without_embedding` gives that one where the head is not tied).
"""

from __future__ import annotations

import gc
import time
from typing import Any

import torch
from goal_io import Step, hbm_bandwidth, log

VOCAB = 151_936
SHAPES: dict[str, dict[str, Any]] = {
    "0.5B": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "tie_word_embeddings": True},
    "7B": {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "intermediate_size": 18944, "tie_word_embeddings": False},
}  # fmt: skip
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "tie_word_embeddings": True}  # fmt: skip
PROMPT, NEW = 32, 256


def build_model(step: Step, shape: dict[str, Any], vocab: int) -> Any:
    """A random Qwen2 of `shape`, its parameters created on the device in the compute dtype."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        **shape,
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if step.cuda else torch.float32)
    try:
        torch.manual_seed(0)
        with torch.device(step.device):
            model: Any = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def roofline(model: Any, rows: int, prompt: int, new: int, bandwidth: float) -> dict[str, float]:
    """Bytes one decode step must read (weights, KV at the mean context) and the time at `bandwidth`."""
    cfg = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    streamed = weights if cfg.tie_word_embeddings else weights - embedding.numel() * embedding.element_size()
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * embedding.element_size()
    kv = rows * per_token * (prompt + new / 2)
    return {
        "weight_bytes": weights,
        "kv_bytes_per_step": round(kv),
        "roofline_ms": round(1000 * (weights + kv) / bandwidth, 4),
        "roofline_ms_without_embedding": round(1000 * (streamed + kv) / bandwidth, 4),
    }


def _requests(rows: int, prompt: int, new: int, vocab: int) -> list[Any]:
    from quartet.rollout import GenerationRequest, SamplingParams

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (rows, prompt), generator=gen).tolist()
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=i) for i in range(rows)
    ]
    return [GenerationRequest(tuple(r), p) for r, p in zip(ids, params, strict=True)]


def engine_case(
    step: Step,
    model: Any,
    rows: int,
    new: int,
    vocab: int,
    profile: bool,
    cuda_graphs: bool = True,
    fused_kernels: str = "auto",
    graph_decode_steps: int = 1,
) -> dict[str, Any]:
    """The built-in engine (CUDA graphs where on CUDA, unless `cuda_graphs` is off; `rollout.fused_kernels`
    and `rollout.graph_decode_steps` as given): a warm-up generate (captures), then a timed one."""
    from quartet.rollout import TorchRolloutEngine

    requests = _requests(rows, PROMPT, new, vocab)
    with TorchRolloutEngine(
        model,
        None,
        max_num_seqs=rows,
        eos_token_ids=[],
        cuda_graphs=cuda_graphs,
        fused_kernels=fused_kernels,
        graph_decode_steps=graph_decode_steps,
    ) as eng:
        kernels = eng.runner.kernels
        step.sync()
        t0 = time.perf_counter()
        eng.generate(requests)
        step.sync()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        outs = eng.generate(requests)
        step.sync()
        seconds = time.perf_counter() - t0
        result: dict[str, Any] = {
            "first_generate_s": round(first, 3),
            "triton_kernels": sorted(kernels.triton) if kernels is not None else [],
        }
        if profile:
            try:  # the profile is extra: its failure must not lose the timed case
                result["profile"] = _profile(step, eng.core, requests)
            except Exception as err:
                result["profile"] = {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:1000]}
    tokens = sum(len(o[0].token_ids) for o in outs)
    busy = result.get("profile", {}).get("device_busy_ms_per_step")
    if busy:  # what the kernels take of a step timed without the profiler; the rest is host time and gaps
        result["profile"]["kernel_share_of_step"] = round(busy / (1000 * seconds / new), 3)
    return {
        "rows": rows,
        "tokens": tokens,
        "seconds": round(seconds, 4),
        "ms_per_step": round(1000 * seconds / new, 4),
        "tokens_per_s": round(tokens / seconds, 1),
        **result,
    }


def _profile(step: Step, core: Any, requests: list[Any], steps: int = 8) -> dict[str, Any]:
    """Device time per kernel over `steps` decode steps driven on this thread (the engine's thread idles),
    the top kernels by self device time, and the device-busy share of the wall time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if step.cuda else [])
    with torch.inference_mode():
        for request in requests:
            core.add(request)
        core.step()  # the prefill, outside the profile
        step.sync()
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            for _ in range(steps):
                core.step()
            step.sync()
        wall = time.perf_counter() - t0
        while core.has_work():
            core.step()
    # On CUDA, the kernels' own rows (an aten op's row repeats its kernels' time: summing both would count
    # it twice); on the CPU (a dry run), the ops' self times.
    key = "self_device_time_total" if step.cuda else "self_cpu_time_total"
    kind = "CUDA" if step.cuda else "CPU"  # torch.autograd.DeviceType's names
    events = [e for e in prof.key_averages() if e.device_type.name == kind and getattr(e, key, 0) > 0]
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    busy_us = sum(getattr(e, key) for e in events) if step.cuda else 0.0  # kernels on one stream: no overlap
    top = [
        {"name": e.key[:90], "calls_per_step": round(e.count / steps, 2),
         "us_per_step": round(getattr(e, key) / steps, 1)}
        for e in events[:12]
    ]  # fmt: skip
    return {
        "steps": steps,
        "wall_ms_per_step": round(1000 * wall / steps, 4),
        "device_busy_ms_per_step": round(busy_us / 1000 / steps, 4),
        "sorted_by": key,
        "top": top,
    }


def hf_case(step: Step, model: Any, rows: int, new: int, vocab: int, static: bool) -> dict[str, Any]:
    """transformers' `generate`, sampled; `static`: a static cache, which on CUDA makes generate compile its
    decode forward (mode `reduce-overhead`: CUDA graphs). The first call (compile) is timed apart."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (rows, PROMPT), generator=gen).to(step.device)
    kwargs: dict[str, Any] = {
        "attention_mask": torch.ones_like(ids),
        "max_new_tokens": new,
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "pad_token_id": 0,
    }
    if static:
        kwargs["cache_implementation"] = "static"
    step.sync()
    t0 = time.perf_counter()
    model.generate(ids, **kwargs)
    step.sync()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = model.generate(ids, **kwargs)
    step.sync()
    seconds = time.perf_counter() - t0
    produced = int(out.shape[1]) - PROMPT
    return {
        "rows": rows,
        "static_cache": static,
        "new_tokens": produced,
        "first_call_s": round(first, 2),
        "ms_per_step": round(1000 * seconds / max(produced, 1), 4),
        "tokens_per_s": round(rows * produced / seconds, 1),
    }


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(step: Step) -> None:
    """Every case, each recorded as it ends; a case that does not fit the step's deadline is skipped."""
    vocab, new = (1000, 8) if step.dry_run else (VOCAB, NEW)
    rows_of = {64: 4, 256: 8} if step.dry_run else {64: 64, 256: 256}
    bandwidth = hbm_bandwidth(step)
    step.put("hbm_bytes_per_s", round(bandwidth))
    for name, estimate in (("0.5B", 25.0), ("7B", 60.0)):  # 0.5B first: seconds, and the HF goal reads it
        if not step.fits(f"{name}/engine", estimate):
            continue
        try:
            model = build_model(step, TINY if step.dry_run else SHAPES[name], vocab)
        except Exception as err:  # (out of memory, say) the other size may still build
            step.put(f"{name}/build", {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
            _free()
            continue
        step.put(f"{name}/params", sum(p.numel() for p in model.parameters()))
        for rows in (64, 256):
            key = f"{name}/{rows}"
            try:
                case = engine_case(step, model, rows_of[rows], new, vocab, profile=(name, rows) == ("7B", 64))
                line = roofline(model, rows_of[rows], PROMPT, new, bandwidth)
                case |= line | {"ratio_to_roofline": round(case["ms_per_step"] / line["roofline_ms"], 3)}
                step.put(key, case)
            except Exception as err:  # a failed case must not hide the next one
                step.put(key, {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
        del model
        _free()
    log("decode: done")


def hf_baseline(step: Step) -> None:
    """HF's static-cache generate at 0.5B/64 rows, compiled by transformers on CUDA (a step of its own: the
    compile's time is the least predictable of the script, and its own deadline spares the rest)."""
    vocab, new, rows = (1000, 8, 4) if step.dry_run else (VOCAB, NEW, 64)
    model = build_model(step, TINY if step.dry_run else SHAPES["0.5B"], vocab)
    step.put("0.5B/64/hf_static_compiled", hf_case(step, model, rows, new, vocab, static=True))
    log("hf_baseline: done")
