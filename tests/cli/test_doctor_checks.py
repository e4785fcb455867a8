"""`quartet doctor`'s device facts and tiny-model smoke test, checked against independent readings."""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from quartet.cli import doctor_checks
from quartet.cli.doctor_checks import (
    GIB,
    CudaDevice,
    CudaFacts,
    HostFacts,
    cuda_facts,
    device_checks,
    host_facts,
    resolve_device,
    smoke_check,
    smoke_test,
)


def _mem_total_from_proc() -> int:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="needs Linux's /proc/meminfo")
@pytest.mark.parametrize("psutil_present", [True, False])
def test_host_facts_agree_with_proc_meminfo(psutil_present: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not psutil_present:
        monkeypatch.setitem(sys.modules, "psutil", None)  # importing it now raises ImportError
    facts = host_facts()
    assert facts.source == ("psutil" if psutil_present and _has_psutil() else "/proc/meminfo")
    assert facts.mem_total_bytes == _mem_total_from_proc()
    assert 0 < facts.mem_available_bytes <= facts.mem_total_bytes
    assert facts.cpus == os.cpu_count()
    assert facts.usable_cpus == len(os.sched_getaffinity(0))


def _has_psutil() -> bool:
    try:
        import psutil  # noqa: F401
    except ImportError:
        return False
    return True


def test_cuda_facts_agree_with_torch() -> None:
    facts = cuda_facts()
    assert facts.available == torch.cuda.is_available() and facts.error == ""
    assert facts.torch_cuda == torch.version.cuda
    assert len(facts.devices) == (torch.cuda.device_count() if facts.available else 0)
    for d in facts.devices:
        assert d.name == torch.cuda.get_device_name(d.index)
        assert 0 < d.free_bytes <= d.total_bytes


def test_device_checks_no_cuda_is_fine_unless_asked_for() -> None:
    host = HostFacts(8, 8, 32 * GIB, 16 * GIB, "test")
    none = CudaFacts(available=False, torch_cuda=None)
    auto = {c.name: c for c in device_checks(host, none, "auto")}
    assert auto["host"].status == "ok" and "16.0 of 32.0 GiB" in auto["host"].message
    assert auto["cuda"].status == "ok" and "no CUDA device" in auto["cuda"].message
    assert resolve_device("auto", none) == "cpu"
    (cuda,) = [c for c in device_checks(host, none, "cuda") if c.name == "cuda"]
    assert cuda.status == "fail" and "--device cpu" in cuda.fix and "cluster.device=cpu" in cuda.fix


def test_device_checks_warn_on_little_free_memory() -> None:
    host = HostFacts(8, 2, 32 * GIB, GIB // 2, "test")
    busy = CudaFacts(
        available=True,
        torch_cuda="12.8",
        devices=[CudaDevice(0, "GPU A", 70 * GIB, 80 * GIB), CudaDevice(1, "GPU B", 4 * GIB, 80 * GIB)],
    )
    checks = {c.name: c for c in device_checks(host, busy, "auto")}
    assert checks["host"].status == "warn" and "2 of 8 CPUs" in checks["host"].message and checks["host"].fix
    assert "cuda" not in checks  # devices are listed one by one
    assert checks["cuda:0"].status == "ok" and "GPU A: 70.0 of 80.0 GiB free" in checks["cuda:0"].message
    assert checks["cuda:1"].status == "warn" and "nvidia-smi" in checks["cuda:1"].fix
    assert resolve_device("auto", busy) == "cuda"
    broken = CudaFacts(available=True, torch_cuda="12.8", error="RuntimeError: CUDA error: busy")
    assert resolve_device("auto", broken) == "cpu"
    (cuda,) = [c for c in device_checks(host, broken, "auto") if c.name == "cuda"]
    assert cuda.status == "fail" and "CUDA error: busy" in cuda.message and "nvidia-smi" in cuda.fix


def test_smoke_passes_on_cpu_and_times_its_stages() -> None:
    result = smoke_test("cpu", timeout_s=180.0)
    assert result.ok, result.error
    assert result.device == "cpu" and not result.timed_out and result.error == ""
    assert result.seconds > 0
    assert list(result.stages) == ["import", "build", "forward_backward", "generate"]
    assert all(t >= 0 for t in result.stages.values())
    assert sum(result.stages.values()) <= result.seconds + 0.01
    assert result.generated_tokens == 4
    # a freshly initialised model predicts about uniformly over the ~512-token vocabulary: loss ~ ln(512)
    assert result.loss is not None and abs(result.loss - math.log(512)) < 1.0
    check = smoke_check(result)
    assert check.status == "ok" and "4 greedy tokens" in check.message


def test_smoke_that_hangs_is_reported_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def hang(device: str, new_tokens: int, state: dict[str, Any]) -> None:
        state["stage"] = "generate"
        release.wait(60)

    monkeypatch.setattr(doctor_checks, "_smoke_body", hang)
    start = time.perf_counter()
    try:
        result = smoke_test("cpu", timeout_s=0.5)
    finally:
        release.set()
    assert time.perf_counter() - start < 50  # the body hangs 60 s: returning earlier is the timeout's doing
    assert not result.ok and result.timed_out and 0.5 <= result.seconds < 50
    assert "0.5 s" in result.error and "'generate'" in result.error
    check = smoke_check(result)
    assert check.status == "fail" and "--smoke-timeout" in check.fix


def test_smoke_error_is_a_failed_check_naming_the_stage() -> None:
    result = smoke_test("no-such-device", timeout_s=180.0)
    assert not result.ok and not result.timed_out
    assert result.stage == "build" and result.error  # moving the model to the device failed
    check = smoke_check(result)
    assert check.status == "fail" and "no-such-device" in check.message and check.fix
