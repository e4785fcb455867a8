"""The update profile's kinds of kernel (benchmarks/gpu/kernel_kinds.py): names as the H200's profile and a
CPU dry run print them land in the kind they are, unknown names are kept as `other` by name, and the shares
are the times over their total."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
from kernel_kinds import by_kind, kind_of  # noqa: E402


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "matmul"),
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT", "matmul"),
        ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn>", "matmul"),
        ("aten::mm", "matmul"),
        ("aten::addmm", "matmul"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("aten::_foreach_addcdiv_", "optimizer"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm"),
        ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", "elementwise"),
        ("aten::silu", "elementwise"),
        ("void at::native::reduce_kernel<512, 1, ReduceOp<float, MaxOps<float>>>", "reduce"),
        ("Memcpy DtoD (Device -> Device)", "copy"),
        ("aten::copy_", "copy"),
        ("void cunn_SoftMaxForward<4, float>", "softmax_logprob"),
        ("some_new_kernel_nobody_knows", "other"),
    ],
)
def test_names_land_in_their_kind(name: str, kind: str) -> None:
    assert kind_of(name) == kind


def test_shares_are_times_over_the_total_and_unknown_names_are_listed() -> None:
    rows = [("aten::mm", 600.0, 10), ("aten::addmm", 200.0, 2), ("aten::mul", 150.0, 30)]
    rows.append(("mystery", 50.0, 1))
    got = by_kind(rows)
    assert got["total_us"] == 1000.0
    assert got["kinds"]["matmul"] == {"us": 800.0, "calls": 12, "share": 0.8}
    assert got["kinds"]["elementwise"]["share"] == 0.15 and got["kinds"]["other"]["share"] == 0.05
    assert list(got["kinds"]) == ["matmul", "elementwise", "other"]  # largest first
    assert got["other_names"] == ["mystery"]
