"""Each kernel compiles for a CUDA GPU (sm_90, the H100/H200) with Triton's real compiler, on this CPU.

The interpreter (the other tests here) runs the kernels' Python semantics; it does not type-check loops,
branches and annotations as the compiler does. Triton compiles to a cubin without a GPU (it ships ptxas),
so this runs anywhere; in a child process, because this one runs Triton interpreted (tests/conftest.py).
Slow (~7 s: the child's imports and four compiles).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from quartet.rollout.torch.kernels.rms_norm_triton import add_rms_norm_kernel
from quartet.rollout.torch.kernels.rope_cache_triton import rope_cache_kernel
from quartet.rollout.torch.kernels.sampler_triton import sampler_kernel

rope = {n: "*bf16" for n in "q_ptr k_ptr v_ptr cos_ptr sin_ptr out_ptr kc_ptr vc_ptr".split()}
strides = "num_heads q_row q_head k_row k_head v_row v_head cos_row sin_row"
strides += " kc_slot kc_head kc_dim vc_slot vc_head vc_col"
rope |= {"len_ptr": "*i64"} | {n: "i32" for n in strides.split()}
rope |= {"HEAD_DIM": "constexpr", "BLOCK": "constexpr"}
norm = {n: "*bf16" for n in "x_ptr res_ptr w_ptr out_ptr sum_ptr".split()}
norm |= {"hidden": "i32", "eps": "fp32", "BLOCK": "constexpr"}
sample = {"logits_ptr": "*bf16", "row_stride": "i32", "temp_ptr": "*fp32", "topk_ptr": "*i64",
          "topp_ptr": "*fp32", "u_ptr": "*fp32", "tok_ptr": "*i64", "lp_ptr": "*fp32", "vocab": "i32",
          "top_step": "i64"} | {n: "constexpr" for n in "RANKED BLOCK SPAN INDEX_BITS KEY_BITS".split()}
# the launchers' settings at the 7B shape: hidden 3584, head dim 128, vocabulary 151,936 in blocks of 4096
vocab = {"BLOCK": 4096, "SPAN": 155648, "INDEX_BITS": 24, "KEY_BITS": 56}
cases = {
    "add_rms_norm": (add_rms_norm_kernel, norm, {"BLOCK": 4096}, 8),
    "rope_cache": (rope_cache_kernel, rope, {"HEAD_DIM": 128, "BLOCK": 128}, 4),
    "sample": (sampler_kernel, sample, {"RANKED": False, **vocab}, 16),
    "sample_ranked": (sampler_kernel, sample, {"RANKED": True, **vocab}, 16),
}
out = {}
for name, (fn, signature, constants, warps) in cases.items():
    try:
        source = ASTSource(fn, signature, constants)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        out[name] = sorted(compiled.asm)
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@pytest.mark.slow
def test_every_kernel_compiles_to_a_cubin_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    failed = {name: r for name, r in results.items() if not isinstance(r, list)}
    assert not failed, failed
    assert all({"ptx", "cubin"} <= set(r) for r in results.values()), results
