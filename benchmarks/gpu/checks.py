"""The checks and measurements of the GPU kit (`benchmarks/gpu/kit.py`), one function each.

Every function takes the kit's `Context` and returns a dict: `status` (`pass`, `fail` or `skip`), `reason`
when not `pass`, and its figures. On CUDA they run at the sizes a GPU user cares about; with `--dry-run`
they run the same code on the CPU at tiny sizes, so CI proves the kit works before a GPU ever sees it.
Nothing here imports Ray: the kit runs from a copy of the working tree on a machine with torch only
(quartet's local backend).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
Result = dict[str, Any]


@dataclass
class Context:
    """Where the kit runs and at which sizes."""

    device: str
    dry_run: bool
    work: Path
    model_dir: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def model_shape(self) -> dict[str, int]:
        """A ~0.5B Qwen2 shape on GPU (Qwen2-0.5B's layers, the tiny tokenizer's vocabulary); tiny on CPU."""
        if self.dry_run:
            return {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "intermediate_size": 128}  # fmt: skip
        return {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                "num_key_value_heads": 2, "intermediate_size": 4864}  # fmt: skip


def _sync(ctx: Context) -> None:
    if ctx.cuda:
        torch.cuda.synchronize()


def build_model(ctx: Context) -> Result:
    """The model folder every later check loads (built from a config: no download)."""
    from quartet.config import TinyModelConfig
    from quartet.models.tiny import save_tiny_model

    start = time.perf_counter()
    ctx.model_dir = save_tiny_model(ctx.work / "model", TinyModelConfig(**ctx.model_shape()))
    from quartet.models.loading import load_causal_lm

    params = sum(p.numel() for p in load_causal_lm(ctx.model_dir).parameters())
    return {"status": "pass", "params": params, "seconds": round(time.perf_counter() - start, 2)}


def random_batch(rows: int, prompt: int, response: int, vocab: int = 500) -> Any:
    """A seeded batch of random prompt and response tokens, every position real."""
    from quartet.core.batch import Batch

    gen = torch.Generator().manual_seed(0)
    return Batch(
        {
            "prompts": torch.randint(5, vocab, (rows, prompt), generator=gen),
            "responses": torch.randint(5, vocab, (rows, response), generator=gen),
            "attention_mask": torch.ones(rows, prompt + response, dtype=torch.int64),
            "response_mask": torch.ones(rows, response, dtype=torch.int64),
        }
    )


def response_nll(outputs: Any, mb: Any, scale: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Minus the mean log-prob of the response tokens (a policy-gradient loss's cost, without its extras)."""
    mask = mb["response_mask"].to(outputs.logprobs.device)
    return -(outputs.logprobs * mask).sum() / scale.tokens, {}


def update_and_planner(ctx: Context) -> Result:
    """FSDP2 engine on the device with parameter and optimizer offload: three optimizer steps, the update's
    tokens/s and MFU, and the memory planner's estimate of the update against the measured peak."""
    from quartet.config import load_config
    from quartet.config.model import Dtype
    from quartet.config.optim import OptimConfig
    from quartet.config.roles import Role
    from quartet.engines import EngineSpec, MicroSpec, TrainingEngine
    from quartet.planning.estimate import estimate_memory
    from quartet.planning.plan import Phase

    rows, prompt, response = (4, 16, 16) if ctx.dry_run else (8, 256, 256)
    offload = ctx.cuda  # offload is a no-op on CPU
    precision = Dtype.BFLOAT16 if ctx.cuda else Dtype.FLOAT32
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    engine = TrainingEngine(
        EngineSpec(
            str(ctx.model_dir),
            mixed_precision=precision,
            optim=OptimConfig(lr=1e-5),
            param_offload=offload,
            optimizer_offload=offload,
        )
    )
    batch, micro = random_batch(rows, prompt, response), MicroSpec(size=rows)
    losses, times = [], []
    for _ in range(3):
        if offload:
            engine.onload()
        _sync(ctx)
        t0 = time.perf_counter()
        losses.append(engine.train_step(batch, response_nll, micro, temperature=1.0)["loss"])
        _sync(ctx)
        times.append(time.perf_counter() - t0)
        if offload:
            engine.offload()
    peak = torch.cuda.max_memory_allocated() if ctx.cuda else None
    params = sum(p.numel() for p in engine.module.parameters())
    tokens = rows * (prompt + response)
    best = min(times[1:])
    flops = 6 * params * tokens / best
    cfg = load_config(
        None,
        [
            f"model.path={ctx.model_dir}",
            f"data.train_batch_size={rows // 2}",
            "rollout.n=2",
            f"actor.mini_batch_size={rows // 2}",
            f"actor.micro_batch_size_per_device={rows}",
            f"data.max_prompt_length={prompt}",
            f"data.max_response_length={response}",
            f"actor.mixed_precision={precision.value}",
            f"actor.param_offload={str(offload).lower()}",
            f"actor.optimizer_offload={str(offload).lower()}",
        ],
    )
    plan = estimate_memory(cfg, device="gpu" if ctx.cuda else "cpu")
    planned = plan.row(Phase.UPDATE_ACTOR, Role.ACTOR).device_bytes
    ok = all(map(_finite, losses))
    result: Result = {
        "status": "pass" if ok else "fail",
        "losses": [round(x, 5) for x in losses],
        "step_seconds": [round(t, 4) for t in times],
        "update_tokens_per_s": round(tokens / best, 1),
        "update_tflops": round(flops / 1e12, 4),
        "params": params,
        "offload": offload,
        "planned_update_bytes": planned,
        "measured_peak_bytes": peak,
    }
    if peak is not None:
        result["planned_over_measured"] = round(planned / max(peak, 1), 3)
        result["mfu"] = round(flops / _peak_flops(ctx), 4)
    if not ok:
        result["reason"] = "a loss was not finite"
    return result


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def _peak_flops(ctx: Context) -> float:
    """The device's measured bf16 matmul FLOP/s (the MFU's denominator)."""
    n = 4096
    a = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16)
    torch.mm(a, b)
    _sync(ctx)
    t0 = time.perf_counter()
    for _ in range(10):
        torch.mm(a, b)
    _sync(ctx)
    return 10 * 2 * n**3 / (time.perf_counter() - t0)


def _rollout(ctx: Context, cuda_graphs: bool, seqs: int, new: int) -> Result:
    """One engine: a warm-up generate (captures graphs), then timed sampled and greedy generations."""
    from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine

    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    prompt = tuple(range(5, 37))
    sampled = [
        GenerationRequest(
            prompt, SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=i)
        )
        for i in range(seqs)
    ]
    greedy = [
        GenerationRequest(tuple(range(5 + i, 37 + i)), SamplingParams(temperature=0.0, max_new_tokens=64))
        for i in range(8)
    ]
    with TorchRolloutEngine.from_pretrained(
        ctx.model_dir, dtype=dtype, device=ctx.device, max_num_seqs=seqs, cuda_graphs=cuda_graphs
    ) as eng:
        _sync(ctx)
        t0 = time.perf_counter()
        eng.generate(sampled)  # warm-up: every row bucket a shrinking batch meets is captured here
        _sync(ctx)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        outs = eng.generate(sampled)
        _sync(ctx)
        seconds = time.perf_counter() - t0
        greedy_ids = [list(o[0].token_ids) for o in eng.generate(greedy)]
        decoder = eng.core.decoder
        stats = (
            {"captures": decoder.captures, "capture_seconds": round(decoder.capture_seconds, 3)}
            if decoder is not None
            else {}
        )
    tokens = sum(len(o[0].token_ids) for o in outs)
    return {
        "tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 1),
        "decode_step_ms": round(1000 * seconds / new, 3),
        "first_generate_seconds": round(first, 3),
        "greedy": greedy_ids,
        **stats,
    }


def rollout_builtin(ctx: Context) -> Result:
    """The built-in engine on the device, eager and with CUDA graphs: tokens/s of one batch of sampled
    generations, the graphs' capture count and time, and whether greedy outputs agree."""
    seqs, new = (4, 8) if ctx.dry_run else (64, 256)
    eager = _rollout(ctx, False, seqs, new)
    graphs = _rollout(ctx, True, seqs, new) if ctx.cuda else None
    ok = eager["tokens"] == seqs * new and (graphs is None or graphs["tokens"] == seqs * new)
    result: Result = {
        "status": "pass" if ok else "fail",
        "tokens": eager["tokens"],
        "tokens_per_s": eager["tokens_per_s"],
        "eager": {k: v for k, v in eager.items() if k != "greedy"},
    }
    if graphs is None:
        result["cuda_graphs"] = "CPU: the engine decodes eagerly (graphs need CUDA)"
    else:
        same = sum(a == b for a, b in zip(eager["greedy"], graphs["greedy"], strict=True))
        result["cuda_graphs"] = {k: v for k, v in graphs.items() if k != "greedy"}
        result["graphs_over_eager"] = round(graphs["tokens_per_s"] / eager["tokens_per_s"], 3)
        result["greedy_sequences_equal"] = f"{same}/{len(eager['greedy'])} (bf16: a near tie may differ)"
    if not ok:
        result["reason"] = f"tokens {eager['tokens']} / {graphs and graphs['tokens']}, expected {seqs * new}"
    return result


def vllm_sleep(ctx: Context) -> Result:
    """vLLM with sleep mode: GPU memory free before, while asleep, and after waking."""
    if not ctx.cuda:
        return {"status": "skip", "reason": "vLLM sleep mode frees GPU memory: CUDA only"}
    try:
        import vllm  # noqa: F401
    except ImportError:
        return {"status": "skip", "reason": "vllm is not installed in this environment"}
    from vllm import LLM

    free0, _ = torch.cuda.mem_get_info()
    llm = LLM(str(ctx.model_dir), enable_sleep_mode=True, gpu_memory_utilization=0.3, enforce_eager=True)
    free_loaded, _ = torch.cuda.mem_get_info()
    llm.sleep(level=1)
    free_asleep, _ = torch.cuda.mem_get_info()
    llm.wake_up()
    released = free_asleep - free_loaded
    return {
        "status": "pass" if released > 0.5 * (free0 - free_loaded) else "fail",
        "held_bytes": free0 - free_loaded,
        "released_bytes": released,
        **({} if released > 0.5 * (free0 - free_loaded) else {"reason": "sleep released under half"}),
    }


def weight_sync(ctx: Context) -> Result:
    """The cross-process weight sync (`benchmarks/weight_sync.py --smoke`: real processes, bitwise check)."""
    out = ctx.work / "weight_sync"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "weight_sync.py"), "--smoke", "--out-dir", str(out)]
    if not ctx.dry_run:
        cmd = cmd[:-3] + ["--out-dir", str(out)]  # the default size (a 16M model, 16 MiB buckets)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ})
    if done.returncode != 0:
        return {"status": "fail", "reason": done.stderr[-2000:]}
    import json

    figures = json.loads(next(out.glob("*.json")).read_text()).get("summary", {})
    return {
        "status": "pass",
        "transport": "gloo (CPU tensors); NCCL is not built (issue 22's gap)",
        "figures": figures,
    }


def grpo_steps(ctx: Context) -> Result:
    """Two GRPO steps of the whole loop on the local backend (no Ray), with the phases' times."""
    from quartet.config import load_config
    from quartet.trainer.loop.rl_trainer import RLTrainer

    size = (["data.train_batch_size=2", "rollout.n=2", "data.max_response_length=8",
             "actor.micro_batch_size_per_device=4"] if ctx.dry_run
            else ["data.train_batch_size=16", "rollout.n=8", "data.max_response_length=256",
                  "actor.micro_batch_size_per_device=16"])  # fmt: skip
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
    os.environ.setdefault("MASTER_PORT", "29533")
    cfg = load_config(
        None,
        [
            "cluster.backend=local",
            f"cluster.device={'gpu' if ctx.cuda else 'cpu'}",
            f"model.path={ctx.model_dir}",
            f"trainer.output_dir={ctx.work / 'runs'}",
            "data.builtin_train_size=64",
            "data.builtin_val_size=4",
            *size,
            f"actor.mini_batch_size={2 if ctx.dry_run else 16}",
            "trainer.total_steps=2",
            "trainer.test_freq=0",
            "trainer.export_final=false",
            "trainer.loggers=[jsonl]",
        ],
    )
    records: list[dict[str, Any]] = []
    result = RLTrainer(cfg, on_record=records.append).run()
    steps = [r for r in records if r.get("kind") == "step"]
    timing = {k: round(v, 4) for k, v in steps[-1].items() if k.startswith("timing_s/")} if steps else {}
    return {
        "status": "pass" if len(steps) == 2 else "fail",
        "steps": len(steps),
        "timing_last_step": timing,
        "run_dir": str(result.run_dir),
    }


def gpu_tests(ctx: Context) -> Result:
    """The suite's GPU tests (`pytest -m gpu`): they skip on a machine without CUDA."""
    files = [
        ROOT / "tests" / "engines" / "test_gpu.py",
        ROOT / "tests" / "engines" / "test_varlen_kernel_gpu.py",
        ROOT / "tests" / "rollout" / "test_graph_decode_gpu.py",
    ]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *map(str, files)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    status = "pass" if done.returncode == 0 else "fail"
    if "skipped" in tail and "passed" not in tail:
        status = "skip"
    return {"status": status, "summary": tail, **({"reason": tail} if status != "pass" else {})}


CHECKS = {
    "build_model": build_model,
    "update_and_planner": update_and_planner,
    "rollout_builtin": rollout_builtin,
    "vllm_sleep": vllm_sleep,
    "weight_sync": weight_sync,
    "grpo_steps": grpo_steps,
    "gpu_tests": gpu_tests,
}


def _register_parallel_check() -> None:
    """The SP/TP check lives in its own module (`parallel_check`), which imports this one."""
    from parallel_check import sp_tp_one_device

    CHECKS["sp_tp_one_device"] = sp_tp_one_device


_register_parallel_check()
