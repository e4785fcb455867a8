"""What `quartet doctor` checks: host memory, CUDA devices, a tiny-model smoke test, and the findings on a
cluster's runs (live / finished / failed / crashed) and dead nodes, from the facts `quartet.cluster.survey`
gathers.

Each finding becomes a `Check` (ok / warn / fail, a message, and the command or config key that fixes it),
so the doctor can end with one list a user reads top to bottom and an exit status scripts can test.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from quartet.cluster.run_record import RankPlace
from quartet.cluster.survey import NodeFacts, RunFacts

__all__ = [
    "Check",
    "CudaDevice",
    "CudaFacts",
    "HostFacts",
    "SmokeResult",
    "cuda_facts",
    "dead_node_checks",
    "device_checks",
    "host_facts",
    "resolve_device",
    "run_checks",
    "smoke_check",
    "smoke_test",
]

Status = Literal["ok", "warn", "fail"]
GIB = 1024**3
LOW_HOST_MEMORY = 2 * GIB  # below this a tiny run still works, a real model's load does not
LOW_GPU_FREE_FRACTION = 0.2  # another process holding most of a GPU is the usual cause of CUDA OOMs


@dataclass(frozen=True)
class Check:
    """One finding: `fix` says what to run or which config key to set when `status` is not ok."""

    name: str
    status: Status
    message: str
    fix: str = ""


@dataclass(frozen=True)
class HostFacts:
    """CPUs and RAM of this machine, read the way the kernel reports them (bytes)."""

    cpus: int
    usable_cpus: int
    mem_total_bytes: int
    mem_available_bytes: int
    source: str


@dataclass(frozen=True)
class CudaDevice:
    index: int
    name: str
    free_bytes: int
    total_bytes: int


@dataclass
class CudaFacts:
    """CUDA as torch sees it; `error` is set when torch has CUDA but querying a device failed."""

    available: bool
    torch_cuda: str | None
    devices: list[CudaDevice] = field(default_factory=list)
    error: str = ""


@dataclass
class SmokeResult:
    """Outcome of `smoke_test`: `stage` is where it was when it failed or ran out of time."""

    device: str
    ok: bool
    seconds: float
    stage: str = ""
    stages: dict[str, float] = field(default_factory=dict)
    loss: float | None = None
    generated_tokens: int = 0
    timed_out: bool = False
    error: str = ""


def host_facts() -> HostFacts:
    """CPU count and RAM: psutil when installed, else /proc/meminfo (so the doctor needs neither)."""
    cpus = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    try:
        mem = importlib.import_module("psutil").virtual_memory()  # optional: not a dependency
        return HostFacts(cpus, usable, int(mem.total), int(mem.available), "psutil")
    except ImportError:
        pass
    info = _meminfo()
    total = info.get("MemTotal", 0)
    return HostFacts(cpus, usable, total, info.get("MemAvailable", info.get("MemFree", 0)), "/proc/meminfo")


def _meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    out: dict[str, int] = {}
    if not Path(path).exists():
        return out
    for line in Path(path).read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def cuda_facts() -> CudaFacts:
    """Each visible CUDA device's name and free/total memory (`mem_get_info` opens a context on each)."""
    try:
        import torch
    except ImportError:  # the packages check reports it
        return CudaFacts(available=False, torch_cuda=None)
    facts = CudaFacts(available=torch.cuda.is_available(), torch_cuda=torch.version.cuda)
    if not facts.available:
        return facts
    try:
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            facts.devices.append(CudaDevice(i, torch.cuda.get_device_name(i), int(free), int(total)))
    except Exception as err:  # a broken driver or a device in use exclusively: a finding, not a crash
        facts.error = f"{type(err).__name__}: {err}"
    return facts


def resolve_device(requested: str, cuda: CudaFacts) -> str:
    """`auto` is cuda when torch sees a CUDA device, else cpu; `cpu` and `cuda` are taken as asked."""
    if requested == "auto":
        return "cuda" if cuda.available and not cuda.error else "cpu"
    return requested


def device_checks(host: HostFacts, cuda: CudaFacts, requested: str) -> list[Check]:
    """Findings about RAM and CUDA; having no CUDA is fine unless `--device cuda` asked for it."""
    checks = []
    mem = f"{_gib(host.mem_available_bytes)} of {_gib(host.mem_total_bytes)} GiB RAM available"
    cpus = f"{host.usable_cpus} of {host.cpus} CPUs usable"
    if host.mem_total_bytes and host.mem_available_bytes < LOW_HOST_MEMORY:
        checks.append(
            Check(
                "host",
                "warn",
                f"only {mem}; {cpus}",
                "stop other jobs, or shrink the run (model.tiny.*, actor.micro_batch_size_per_device)",
            )
        )
    else:
        checks.append(Check("host", "ok", f"{mem}; {cpus}"))
    if cuda.error:
        checks.append(
            Check(
                "cuda",
                "fail",
                f"torch sees CUDA but querying a device failed: {cuda.error}",
                "check the driver with `nvidia-smi` and CUDA_VISIBLE_DEVICES, or use --device cpu "
                "and cluster.device=cpu",
            )
        )
    elif not cuda.available:
        if requested == "cuda":
            why = "torch has no CUDA build" if cuda.torch_cuda is None else "no CUDA device is visible"
            checks.append(
                Check("cuda", "fail", f"--device cuda, but {why}", "use --device cpu and cluster.device=cpu")
            )
        else:
            checks.append(Check("cuda", "ok", "no CUDA device: runs train on the CPU (cluster.device=auto)"))
    for d in cuda.devices:
        text = f"cuda:{d.index} {d.name}: {_gib(d.free_bytes)} of {_gib(d.total_bytes)} GiB free"
        if d.total_bytes and d.free_bytes < LOW_GPU_FREE_FRACTION * d.total_bytes:
            checks.append(
                Check(
                    f"cuda:{d.index}",
                    "warn",
                    text + " (other processes hold the rest)",
                    "`nvidia-smi` lists the processes holding it; pick free GPUs with CUDA_VISIBLE_DEVICES",
                )
            )
        else:
            checks.append(Check(f"cuda:{d.index}", "ok", text))
    return checks


def precision_check(device: str) -> Check:
    """What `mixed_precision: auto` picks here, and the matmul figures behind it on CPU."""
    from quartet.engines.precision import ENV, auto_precision, resolve_precision

    pinned = os.environ.get(ENV, "")
    if pinned:
        return Check("precision", "ok", f"mixed_precision=auto is pinned to {pinned} ({ENV})")
    if device.startswith("cuda"):
        return Check(
            "precision", "ok", f"mixed_precision=auto -> {resolve_precision('auto', device).value} on CUDA"
        )
    fig = auto_precision()
    return Check(
        "precision",
        "ok",
        f"mixed_precision=auto -> {fig.choice}: a 512x512 matmul runs at {fig.bfloat16_gflops:.1f} GFLOP/s "
        f"in bf16 vs {fig.float32_gflops:.1f} in fp32 ({fig.ratio:.2f}x) on {fig.key}; cached in "
        f"{fig.cache or '(not cached)'}: delete it to measure again",
    )


def smoke_test(device: str, timeout_s: float = 10.0, new_tokens: int = 4) -> SmokeResult:
    """Build a tiny Qwen2 with the tiny-model kit on `device`, run forward+backward and greedy generation.

    It runs in a daemon thread joined with `timeout_s`, so a hanging device (a CUDA init stuck on a busy
    GPU, a deadlocked thread pool) makes it report a timeout instead of hanging the doctor. The thread
    cannot be killed: on a timeout it is left behind and dies with the process.
    """
    state: dict[str, Any] = {"stage": "start", "stages": {}}
    start = time.perf_counter()
    worker = threading.Thread(
        target=_smoke_body, args=(device, new_tokens, state), name="quartet-doctor-smoke", daemon=True
    )
    worker.start()
    worker.join(timeout_s)
    seconds = time.perf_counter() - start
    result = SmokeResult(device, False, seconds, stage=state["stage"], stages=dict(state["stages"]))
    if worker.is_alive():
        result.timed_out = True
        result.error = f"no result after {timeout_s:g} s (still in '{result.stage}')"
    elif "error" in state:
        result.error = state["error"]
    else:
        result.ok = True
        result.loss = state["loss"]
        result.generated_tokens = state["generated"]
    return result


def _smoke_body(device: str, new_tokens: int, state: dict[str, Any]) -> None:
    def stage(name: str) -> None:
        now = time.perf_counter()
        if "t" in state:
            state["stages"][state["stage"]] = round(now - state["t"], 3)
        state["stage"], state["t"] = name, now

    try:
        stage("import")
        import torch

        from quartet.config import TinyModelConfig
        from quartet.models.tiny import build_tiny_causal_lm, build_tiny_tokenizer

        stage("build")
        spec = TinyModelConfig()
        tokenizer = build_tiny_tokenizer(spec.vocab_size, spec.seed)
        model: Any = build_tiny_causal_lm(spec, tokenizer)
        model.to(device)
        batch = tokenizer(["What is 12 + 7? The answer is"], return_tensors="pt").to(device)
        stage("forward_backward")
        out = model(**batch, labels=batch["input_ids"])
        out.loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        if not torch.isfinite(out.loss) or any(g is None or not torch.isfinite(g).all() for g in grads):
            raise FloatingPointError(f"loss {out.loss.item()} or a gradient is not finite")
        state["loss"] = float(out.loss.item())
        stage("generate")
        model.eval()
        with torch.no_grad():
            ids = model.generate(
                **batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
            )
        state["generated"] = int(ids.shape[1] - batch["input_ids"].shape[1])
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        stage("done")
    except Exception as err:  # reported as the smoke's failure
        state["error"] = f"{type(err).__name__}: {err}"


def smoke_check(result: SmokeResult) -> Check:
    """The smoke's finding: a timeout or an error is a fail, with the flag that works around it."""
    if result.ok:
        return Check(
            "smoke",
            "ok",
            f"tiny Qwen2 on {result.device}: forward+backward and {result.generated_tokens} greedy tokens "
            f"in {result.seconds:.1f} s",
        )
    if result.timed_out:
        fix = "on a busy machine retry with --smoke-timeout 60" + (
            "; if it still hangs, try --device cpu" if result.device.startswith("cuda") else ""
        )
    elif result.device.startswith("cuda"):
        fix = "check the GPU with `nvidia-smi`, or run on the CPU: --device cpu and cluster.device=cpu"
    else:
        fix = "reinstall the environment (pip install -c constraints.txt -e .) and rerun `quartet doctor`"
    return Check("smoke", "fail", f"tiny Qwen2 on {result.device} failed: {result.error}", fix)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


RUN_FIX = "the run's driver log says why; `ray list actors --detail` shows each death cause"


def run_checks(runs: list[RunFacts]) -> list[Check]:
    """One finding per run: live and finished are ok, failed and crashed warn with the cause."""
    out = []
    for r in runs:
        name = f"run {r.namespace}/{r.prefix}"
        alive = f"{r.alive} of {len(r.actors)} actors alive"
        if r.status == "live":
            out.append(Check(name, "ok", f"live: {alive}"))
        elif r.status == "finished":
            how = (
                "its run_state.json says finished" if r.run_state else "its actors were shut down (ray.kill)"
            )
            out.append(Check(name, "ok", f"finished: {how}"))
        elif r.status == "failed":
            fix = "the driver log has the traceback; trainer.resume=auto continues from the last checkpoint"
            out.append(Check(name, "warn", f"failed: {r.cause}", fix))
        else:
            out.append(Check(name, "warn", f"crashed ({alive}): {r.cause}", RUN_FIX))
    return out


def dead_node_checks(
    nodes: list[NodeFacts], runs: list[RunFacts], recorded: dict[str, list[RankPlace]] | None = None
) -> list[Check]:
    """A warning per dead node: its id and IP, and the ranks of the listed runs that were there (from the
    actors' node ids, and from the run folder's recorded `ranks` when given)."""
    out = []
    for n in nodes:
        if n.alive:
            continue
        there = [f"{r.prefix} {a.label}:{a.rank}" for r in runs for a in r.actors if a.node_id == n.node_id]
        prefix = runs[0].prefix if len(runs) == 1 else ""
        for label, places in (recorded or {}).items():
            there += [f"{prefix} {label}:{p.rank}".strip() for p in places if p.node_id == n.node_id]
        ranks = (
            f"ranks there: {', '.join(dict.fromkeys(there))}" if there else "no listed run had a rank there"
        )
        out.append(
            Check(
                f"node {n.node_id}",
                "warn",
                f"node {n.node_id} ({n.ip}) is dead; {ranks}",
                "`ray status` and the node's raylet log say why; runs with ranks there resume from their "
                "last checkpoint (trainer.resume=auto) once the cluster has the nodes again",
            )
        )
    return out
