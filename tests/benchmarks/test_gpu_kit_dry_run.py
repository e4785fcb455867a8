"""The GPU kit's dry run (benchmarks/gpu/kit.py --dry-run): every check runs on the CPU at tiny sizes, with
Ray unimportable (the kit must run from a working-tree copy on a torch-only GPU machine), and writes JSON
whose figures follow from each other."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

KIT = Path(__file__).parents[2] / "benchmarks" / "gpu" / "kit.py"
NO_RAY = """
import importlib.abc, runpy, sys
class NoRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("ray is not installed on this machine")
sys.meta_path.insert(0, NoRay())
sys.argv = [sys.argv[1], "--dry-run", "--out", sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_the_kit_dry_run_passes_without_ray(tmp_path: Path) -> None:
    out = tmp_path / "kit.json"
    done = subprocess.run(
        [sys.executable, "-c", NO_RAY, str(KIT), str(out)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    checks = record["checks"]
    assert record["dry_run"] is True and list(checks) == [
        "build_model",
        "update_and_planner",
        "rollout_builtin",
        "vllm_sleep",
        "weight_sync",
        "grpo_steps",
        "gpu_tests",
        "sp_tp_one_device",
    ]
    assert {name: c["status"] for name, c in checks.items() if c["status"] != "pass"} == {
        "vllm_sleep": "skip",  # CUDA only
        "gpu_tests": "skip",  # no CUDA here
    }
    update = checks["update_and_planner"]
    assert len(update["losses"]) == 3 and update["planned_update_bytes"] > 0
    tokens = 4 * (16 + 16)  # the dry run's rows x (prompt + response)
    assert update["update_tokens_per_s"] == pytest.approx(tokens / min(update["step_seconds"][1:]), rel=0.01)
    assert checks["rollout_builtin"]["tokens"] == 4 * 8
    assert checks["grpo_steps"]["steps"] == 2 and "timing_s/gen" in checks["grpo_steps"]["timing_last_step"]
    assert checks["weight_sync"]["figures"]["bytes"] > 0
    parallel = checks["sp_tp_one_device"]
    assert parallel["vocab_parallel"]["shards"] == 4 and parallel["vocab_parallel"]["grad_max_diff"] < 1e-4
    assert parallel["tp_mesh"]["logits_scale"] > 0 and "2+ GPUs" in parallel["needs_more_gpus"]


@pytest.mark.slow
def test_the_decode_profile_dry_run_times_every_decode_step(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    script = KIT.parent / "decode_profile.py"
    done = subprocess.run(
        [sys.executable, "-c", NO_RAY, str(script), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    # 8 rows of 16 new tokens: the prefill samples the first token, then 15 decode steps
    assert run["cuda_graphs"] is False and run["decode_steps"] == 15
    assert set(run["parts_ms"]) == {"forward", "sample", "append"}
    assert 0 < run["parts_ms"]["forward"] <= run["step_ms"] * 1.5


@pytest.mark.slow
def test_the_compiled_graph_decode_dry_run_matches_the_eager_step(tmp_path: Path) -> None:
    out = tmp_path / "compile.json"
    done = subprocess.run(
        [sys.executable, "-c", NO_RAY, str(KIT.parent / "graph_compile.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["graphs"] is False and record["rows"] == 4  # the CPU has no graphs: both run eagerly
    assert record["max_logit_difference"] < 1e-4  # inductor's float32 forward is the eager one
    assert record["compile_and_capture_s"] > 0


def _qwen2_params(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, mlp: int) -> int:
    """Parameters of a Qwen2 with tied embeddings, counted from its layout (q/k/v biases, no o bias)."""
    kv = kv_heads * (hidden // heads)
    attention = hidden * hidden + hidden + 2 * (hidden * kv + kv) + hidden * hidden
    return vocab * hidden + layers * (attention + 3 * hidden * mlp + 2 * hidden) + hidden


def test_the_goals_script_dry_run_measures_every_step_and_keeps_its_figures_consistent(
    tmp_path: Path,
) -> None:
    """Issue 37's GPU script (benchmarks/gpu/goals.py --dry-run): every step runs or says why not, the decode
    roofline and the update MFU follow from the bytes and FLOPs the script records, and a dry run marks no
    goal met or missed (its tiny CPU figures say nothing of the goals)."""
    done = subprocess.run(
        [sys.executable, "-c", NO_RAY, str(KIT.parent / "goals.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "goals.json").read_text())
    steps = record["steps"]
    assert list(steps) == [
        "decode",
        "fp8_decode",
        "decode_kernels",
        "hf_baseline",
        "update",
        "moe",
        "first_step",
        "async_vs_sync",
        "hooks",
        "trl",
        "first_step_example",
    ]
    assert all(s["status"] in ("pass", "skip") for s in steps.values()), {
        n: s.get("reason") for n, s in steps.items()
    }
    decode = steps["decode"]
    params = _qwen2_params(1000, 64, 2, 4, 2, 128)  # the dry run's tiny shape, full-vocabulary stand-in
    assert decode["7B/params"] == decode["0.5B/params"] == params
    bandwidth = decode["hbm_bytes_per_s"]
    for key, rows in (("0.5B/64", 4), ("0.5B/256", 8), ("7B/64", 4), ("7B/256", 8)):
        case = decode[key]
        assert case["tokens"] == rows * 8 and case["weight_bytes"] == 4 * params  # fp32 on the CPU
        kv = (
            rows * 2 * 2 * 2 * 16 * 4 * (32 + 8 / 2)
        )  # rows x layers x K,V x kv heads x head dim x fp32 x context
        assert case["kv_bytes_per_step"] == pytest.approx(kv, abs=1)
        # the record rounds to 4 decimals: a tiny roofline (a fast copy) is off by up to 5e-5 ms
        assert case["roofline_ms"] == pytest.approx(1000 * (4 * params + kv) / bandwidth, rel=1e-3, abs=5e-5)
        assert case["ratio_to_roofline"] == pytest.approx(case["ms_per_step"] / case["roofline_ms"], rel=1e-2)
    assert decode["7B/64"]["profile"]["top"]
    _check_fp8(steps["fp8_decode"], params)
    kernels = steps["decode_kernels"]  # issue 54: on the CPU the kernels are not timed, both settings decode
    assert kernels["kernels"]["status"] == "skip" and "CUDA" in kernels["kernels"]["reason"]
    for size in ("0.5B", "7B"):
        case = kernels[f"{size}/64"]
        assert case["off"]["tokens"] == case["auto"]["tokens"] == 4 * 8
        assert case["off"]["triton_kernels"] == case["auto"]["triton_kernels"] == []  # auto on CPU: torch
        ratio = case["off"]["ms_per_step"] / case["auto"]["ms_per_step"]
        assert case["speedup"] == pytest.approx(ratio, rel=0.01)
        assert case["auto_4_steps"]["tokens"] == 4 * 8  # on the CPU no graphs: the same decode, timed
        blocks = case["auto"]["ms_per_step"] / case["auto_4_steps"]["ms_per_step"]
        assert case["4_steps_over_auto"] == pytest.approx(blocks, rel=0.01)
    hf = steps["hf_baseline"]["0.5B/64/hf_static_compiled"]
    assert hf["new_tokens"] == 8 and hf["static_cache"] is True
    (update_key,) = [k for k in steps["update"] if k.startswith("update")][:1]
    update = steps["update"][update_key]
    best = min(update["step_seconds"][1:])
    assert update["tokens"] == 4 * (8 + 16) and update["tokens_per_s"] == pytest.approx(
        update["tokens"] / best, rel=0.01
    )
    profile = update["profile"]  # the update's time by kind: matmuls lead, the shares add up to one
    assert profile["total_us"] > 0 and "matmul" in profile["kinds"]
    assert sum(k["share"] for k in profile["kinds"].values()) == pytest.approx(1.0, abs=1e-3)
    flops = 6 * update["params"] * update["tokens"] / best
    assert update["mfu"] == pytest.approx(flops / steps["update"]["matmul_flops_per_s"], rel=0.01, abs=1e-4)
    _check_moe(steps["moe"])
    first = steps["first_step"]["example_1.5B"]
    assert first["steps"] == 1 and first["startup"]["to_first_step_s"] > first["startup"]["imports_s"] > 0
    assert steps["first_step_example"]["example_0.36B"]["status"] == "pass"  # its GPU config loads
    assert all(g["met"] is None for g in record["goals"].values())
    variants = [v for k, v in steps["update"].items() if k.startswith("update")]
    assert record["goals"]["update_1.5B_mfu"]["figure"] == max(v["mfu"] for v in variants)  # the best variant
    span_by_span = steps["update"]["update/varlen_kernel=off"]  # the kernel's difference, measured on a GPU
    assert span_by_span["varlen_kernel_off"] == "turned off by set_varlen_kernel(False)"
    assert span_by_span["first_loss_gap_vs_kernel"] < 1e-6  # the CPU runs span by span both times
    assert update["varlen_kernel_calls"] == 0 and update["varlen_kernel_off"] is None  # the CPU has no kernel


def _check_fp8(fp8: dict[str, Any], params: int) -> None:
    """The fp8 decode step on the CPU: the scaled matmul skipped (no CUDA), the emulation decoded, and the
    weight bytes and rooflines follow from the tiny shape's projections, counted here."""
    assert fp8["scaled_mm"]["status"] == "skip"
    hidden, kv, mlp, layers = 64, 2 * 16, 128, 2  # the dry run's tiny Qwen2
    projections = layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp)
    channels = layers * (2 * hidden + 2 * kv + 2 * mlp + hidden)
    quantized = fp8["7B/quantized"]
    assert quantized["projections"] == 7 * layers and quantized["path"] == "emulated"
    assert quantized["unquantized_weight_bytes"] == 4 * params  # fp32 on the CPU
    assert quantized["fp8_weight_bytes"] == 4 * (params - projections) + projections + 4 * channels
    bandwidth = fp8["hbm_bytes_per_s"]
    for key, rows in (("7B/64", 4), ("7B/256", 8)):
        case = fp8[key]
        assert case["tokens"] == rows * 8
        want = 1000 * (quantized["fp8_weight_bytes"] + case["kv_bytes_per_step"]) / bandwidth
        assert case["fp8_roofline_ms"] == pytest.approx(want, rel=1e-3, abs=5e-5)
        assert case["fp8_roofline_ms"] < case["bf16_roofline_ms"]
        assert case["ratio_to_bf16_roofline"] == pytest.approx(
            case["ms_per_step"] / case["bf16_roofline_ms"], rel=1e-2
        )


def _check_moe(moe: dict[str, Any]) -> None:
    """The MoE step: the experts ran on the grouped matmul this torch has, and the decode and update figures
    follow from the tokens and times it records; the parameter counts from the shape, counted here."""
    import torch

    shape = moe["shape"]
    h, layers, e, k, i = (shape[x] for x in ("hidden_size", "num_hidden_layers", "num_experts",
                                             "num_experts_per_tok", "moe_intermediate_size"))  # fmt: skip
    assert moe["shape"]["params"] - moe["shape"]["active_params"] == layers * (e - k) * 3 * h * i
    experts = moe["experts"]
    if hasattr(torch.nn.functional, "grouped_mm"):  # torch >= 2.10: transformers' grouped_mm runs it
        assert experts["experts_implementation"] == "grouped_mm"
        assert experts["grouped_mm_called"] == "torch.nn.functional.grouped_mm"
        assert experts["grouped_mm_calls_per_forward"][experts["grouped_mm_called"]] == 2 * layers  # up, down
    decode = moe["decode/64"]
    assert decode["tokens"] == 4 * 8 and decode["cuda_graphs"] is False  # the dry run's 4 rows x 8 tokens
    assert decode["tokens_per_s"] == pytest.approx(decode["tokens"] / decode["seconds"], rel=0.01)
    update = moe["update"]
    best = min(update["step_seconds"][1:])
    assert update["tokens"] == 4 * (8 + 16) and len(update["losses"]) == 3
    assert update["tokens_per_s"] == pytest.approx(update["tokens"] / best, rel=0.01)
    flops = 6 * moe["shape"]["active_params"] * update["tokens"] / best
    assert update["mfu_active"] == pytest.approx(flops / moe["matmul_flops_per_s"], rel=0.01, abs=1e-4)
    assert (
        update["peak_memory_bytes"] > 0
        and update["experts_implementation"] == experts["experts_implementation"]
    )


def test_a_goals_step_runs_in_a_child_process_and_its_part_file_is_its_record(tmp_path: Path) -> None:
    """The GPU run's path (each step a child process with a deadline, read back from its part file), here
    with the cheapest step: the hooks, which in a dry run record whether each hook exists."""
    sys.path.insert(0, str(KIT.parent))
    try:
        import goals
    finally:
        sys.path.remove(str(KIT.parent))
    record = goals.run_step("hooks", tmp_path, time.time() + 120, dry_run=True)
    assert record["status"] == "pass" and record["seconds"] > 0
    assert set(record) >= {"fused_head", "cuda_ipc", "demo_gpu"}
    assert all(
        record[h]["status"] == "skip" and record[h]["reason"] for h in ("fused_head", "cuda_ipc", "demo_gpu")
    )
    assert json.loads((tmp_path / "hooks.part.json").read_text())["demo_gpu"] == record["demo_gpu"]
