"""A host keeps the memory it frees (`cluster.keep_freed_memory`, `quartet.cluster.host_memory`): phases
that allocate and free the same blocks stop faulting pages in, where glibc's defaults unmap the large ones
and fault them in again every phase.
Each case runs in a fresh process, so this suite's own allocator is left as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from quartet.cluster.pool import ResourcePool
from quartet.config.cluster import ClusterConfig

PHASE_MIB = (8, 40, 16, 64, 24)
"""One phase's blocks, as a step's activations: some above glibc's largest mmap threshold (32 MiB)."""
PHASE_PAGES = sum(PHASE_MIB) * 2**20 // 4096

SCRIPT = """
import resource, sys, torch
from quartet.cluster.host import RoleHost
where, keep = sys.argv[1:3]
host = RoleHost(0, 1, 0, "memory-test", in_process=where == "driver", keep_freed_memory=keep == "keep")
PHASE_MIB = tuple(int(x) for x in sys.argv[3].split(","))
def phase():
    blocks = [torch.empty(mib * 2**18, dtype=torch.float32) for mib in PHASE_MIB]
    for block in blocks:
        block.fill_(1.0)
    del blocks
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    phase()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(host.keeps_freed_memory, sum(faults[3:]))
"""


def _late_faults(where: str, keep: str, tmp_path: Path) -> tuple[bool, int]:
    """Whether the host kept its freed memory, and the page faults of phases 4-6 of 6 alike."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, where, keep, ",".join(map(str, PHASE_MIB))],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    kept, faults = out.stdout.split()[-2:]
    return kept == "True", int(faults)


def _transparent_huge_pages_always() -> bool:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.exists() and "[always]" in path.read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_host_reuses_what_it_freed_without_faulting_it_in(tmp_path: Path) -> None:
    """Three late phases fault in under half a phase's pages (a phase's first blocks may land past the
    kept ones once); under glibc's defaults they fault in most of every phase's pages again."""
    kept, faults = _late_faults("host", "keep", tmp_path)
    assert kept
    assert faults < PHASE_PAGES // 2, f"{faults} page faults in 3 phases of {PHASE_PAGES} kept pages"
    if _transparent_huge_pages_always():  # 2 MiB pages: glibc's own refaults are few too
        return
    kept, faults = _late_faults("host", "default", tmp_path)
    assert not kept
    assert faults > PHASE_PAGES * 3 // 2, f"glibc's defaults faulted in only {faults} pages in 3 phases"


def test_the_driver_process_is_left_as_it_is(tmp_path: Path) -> None:
    kept, _ = _late_faults("driver", "keep", tmp_path)
    assert not kept


def test_the_pool_carries_the_setting_to_its_hosts() -> None:
    for keep in (True, False):
        pool = ResourcePool.planned(ClusterConfig(keep_freed_memory=keep), "main", use_gpu=False)
        assert pool.keep_freed_memory is keep
