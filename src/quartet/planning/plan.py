"""`MemoryPlan`: the planner's answer, one row per (phase, role) on one bundle, with its peaks.

A row says how many bytes a role holds on the device and in host memory while a phase runs: its resident
state (weights, optimizer states, KV cache) whether or not it works in that phase, plus the working memory
of the phase when it is the role that works. A phase's total is the sum over roles; the peak is the
largest phase total. Phase names are the trainer's timing names (`timing_s/<phase>`), so a plan can be
set next to the measured step.

On a CPU bundle the "device" is host memory: the two are one pool, offloading moves nothing, and the
plan's peaks are the combined figure (`unified`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from quartet.config.roles import Role

__all__ = ["MemoryPlan", "Phase", "PlanRow", "format_bytes"]


class Phase(StrEnum):
    """Phases of one RL step, in order (names as in `timing_s/<phase>`)."""

    GEN = "gen"  # rollout: generation with the KV cache
    REWARD = "reward"  # reward-model scoring
    OLD_LOG_PROB = "old_log_prob"  # actor forward, no grad, with entropy
    REF = "ref"  # reference log-probs (the actor with adapters disabled under LoRA)
    TEACHER = "teacher"  # the distillation teacher's log-probs of the sampled tokens
    VALUES = "values"  # critic forward, no grad
    UPDATE_CRITIC = "update_critic"  # critic forward/backward/optimizer step
    UPDATE_ACTOR = "update_actor"  # actor forward/backward/optimizer step


@dataclass(frozen=True)
class PlanRow:
    """What one role holds during one phase."""

    phase: Phase
    role: Role
    device_bytes: int
    host_bytes: int
    breakdown: dict[str, int]
    """Bytes by component; host-memory components are prefixed `host.` (e.g. `host.optimizer`)."""

    @property
    def total_bytes(self) -> int:
        """Device plus host bytes."""
        return self.device_bytes + self.host_bytes


def format_bytes(n: float) -> str:
    """`1.50 GiB`, `12.0 MiB`, `512 B`."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class MemoryPlan:
    """Estimated memory of one bundle over one RL step."""

    rows: tuple[PlanRow, ...]
    device: str
    """`cpu` or `gpu`."""
    world_size: int = 1
    sequence_parallel: int = 1
    """`model.sequence_parallel_size` of the policy's engines (tokens split over this many ranks)."""
    tensor_parallel: int = 1
    """`model.tensor_parallel_size` of the policy's engines (layers and head split over this many ranks)."""
    expert_parallel: int = 1
    """`model.expert_parallel_size` of the policy's engines (each MoE layer's experts split over this many
    ranks; composes with data parallelism, so it is not a factor of the world's dp x sp x tp)."""
    notes: tuple[str, ...] = ()
    """Assumptions the figures rest on, in words."""
    sizes: dict[str, int] = field(default_factory=dict)
    """The workload the plan assumed (tokens per micro-batch of each phase, KV-cache tokens, ...)."""

    @property
    def unified(self) -> bool:
        """True on CPU, where device and host memory are the same memory."""
        return self.device == "cpu"

    @property
    def phases(self) -> tuple[Phase, ...]:
        """Phases of the plan, in step order."""
        return tuple(dict.fromkeys(r.phase for r in self.rows))

    def row(self, phase: Phase | str, role: Role | str) -> PlanRow:
        """The row of `role` in `phase` (KeyError if the plan has none)."""
        for r in self.rows:
            if r.phase == phase and r.role == role:
                return r
        raise KeyError(
            f"no row for phase '{phase}' and role '{role}' (phases: {list(map(str, self.phases))})"
        )

    def phase_device(self, phase: Phase | str) -> int:
        """Device bytes of every role during `phase` (device + host on CPU)."""
        rows = [r for r in self.rows if r.phase == phase]
        return sum(r.total_bytes if self.unified else r.device_bytes for r in rows)

    def phase_host(self, phase: Phase | str) -> int:
        """Host bytes of every role during `phase` (device + host on CPU)."""
        rows = [r for r in self.rows if r.phase == phase]
        return sum(r.total_bytes if self.unified else r.host_bytes for r in rows)

    @property
    def peak_phase(self) -> Phase:
        """The phase with the largest device total."""
        return max(self.phases, key=self.phase_device)

    @property
    def peak_device(self) -> int:
        """Largest device total over phases (on CPU: the combined device + host figure)."""
        return max((self.phase_device(p) for p in self.phases), default=0)

    @property
    def peak_host(self) -> int:
        """Largest host total over phases (on CPU: the same combined figure as `peak_device`)."""
        return max((self.phase_host(p) for p in self.phases), default=0)

    @property
    def data_parallel(self) -> int:
        """Data-parallel groups of the policy: world / (sp x tp)."""
        return max(1, self.world_size // (self.sequence_parallel * self.tensor_parallel))

    @property
    def layout_text(self) -> str:
        """`world size 4 = dp 2 x sp 2 x tp 1`: how the policy's engines spread, per rank figures below
        (`, experts over ep 2` with expert parallelism)."""
        text = (
            f"world size {self.world_size} = dp {self.data_parallel} x sp {self.sequence_parallel} "
            f"x tp {self.tensor_parallel}"
        )
        return text + (f", experts over ep {self.expert_parallel}" if self.expert_parallel > 1 else "")

    def render_table(self) -> str:
        """The plan as plain text: one line per (phase, role), a total per phase, the peaks."""
        if self.unified:
            header = "Memory plan (cpu: device and host are the same memory; totals are their sum"
        else:
            header = f"Memory plan ({self.device}, per device"
        header += f"; {self.layout_text})"
        lines = [header, f"{'phase':<14}{'role':<14}{'device':>12}{'host':>12}  breakdown"]
        for phase in self.phases:
            for r in (r for r in self.rows if r.phase == phase):
                parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in r.breakdown.items() if v)
                lines.append(
                    f"{phase:<14}{r.role:<14}{format_bytes(r.device_bytes):>12}"
                    f"{format_bytes(r.host_bytes):>12}  {parts}"
                )
            lines.append(
                f"{phase:<14}{'= total':<14}{format_bytes(self.phase_device(phase)):>12}"
                f"{format_bytes(self.phase_host(phase)):>12}"
            )
        where = "combined" if self.unified else "device"
        lines.append(f"peak ({where}): {format_bytes(self.peak_device)} at {self.peak_phase}")
        if not self.unified:
            lines.append(f"peak (host): {format_bytes(self.peak_host)}")
        if self.sizes:
            lines.append("per rank: " + ", ".join(f"{k} {v:,}" for k, v in self.sizes.items()))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data: rows, per-phase totals, peaks, notes and sizes."""
        return {
            "device": self.device,
            "unified_memory": self.unified,
            "world_size": self.world_size,
            "data_parallel_size": self.data_parallel,
            "sequence_parallel_size": self.sequence_parallel,
            "tensor_parallel_size": self.tensor_parallel,
            "expert_parallel_size": self.expert_parallel,
            "peak_device_bytes": self.peak_device,
            "peak_host_bytes": self.peak_host,
            "peak_phase": str(self.peak_phase) if self.rows else None,
            "phases": {
                str(p): {"device_bytes": self.phase_device(p), "host_bytes": self.phase_host(p)}
                for p in self.phases
            },
            "rows": [
                {
                    "phase": str(r.phase),
                    "role": str(r.role),
                    "device_bytes": r.device_bytes,
                    "host_bytes": r.host_bytes,
                    "breakdown": dict(r.breakdown),
                }
                for r in self.rows
            ],
            "notes": list(self.notes),
            "sizes": dict(self.sizes),
        }
