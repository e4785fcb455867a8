"""The memory planner against measured peaks: the real phase code (engine update, log-prob pass, rollout
generation) runs in a fresh process (`measure_peak_rss`) and its peak RSS increase is set next to the plan's
row for that role and phase, for a tiny model and a ~100M-parameter one. Within 25% is the goal. The world-2
cases run two gloo ranks of the actor engine at once (data parallel, sequence parallel, tensor parallel)
and set the larger rank's peak next to the plan's per-rank row.
"""

from __future__ import annotations

import socket
import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import planner_probes as probes
import pytest

from quartet.config import load_config
from quartet.config.roles import Role
from quartet.planning.estimate import estimate_memory
from quartet.planning.measure import measure_peak_rss
from quartet.planning.plan import MemoryPlan, Phase, format_bytes

TOLERANCE = 0.25
NOISE_BYTES = 8 * 2**20
"""What the same phase's peak RSS moves by from one environment to another, whatever its size: the runtime's
own scratch (allocator arenas, thread-local buffers). The tiny rollout phase holds ~5 MiB of tensors over a
12 MiB runtime constant and measured 16.0-17.4 MiB here but 22.1-23.2 MiB in CI (medians of three), so at
that size 25% is narrower than the noise; a difference within NOISE_BYTES passes. Every other row is over
60 MiB, where 25% is the stricter bound."""


@dataclass(frozen=True)
class Size:
    name: str
    config: dict[str, int | bool]
    micro: int
    prompt_len: int
    response_len: int
    repeats: int
    """Fresh-process measurements per phase; the median counts. At the tiny size glibc's heap decides much
    of a peak (one update phase: 113-135 MiB over three fresh processes, 83.4 MiB each time with
    MALLOC_MMAP_THRESHOLD_=131072), so one measurement would let the allocator decide the test."""


TINY = Size(
    "tiny",
    {
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 2048,
        "tie_word_embeddings": True,
    },
    micro=16,
    prompt_len=64,
    response_len=64,
    repeats=5,
)
M100 = Size(
    "100M",
    {
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "tie_word_embeddings": True,
    },
    micro=4,
    prompt_len=64,
    response_len=64,
    repeats=1,
)


@pytest.fixture(
    scope="module", params=[TINY, pytest.param(M100, marks=pytest.mark.slow)], ids=lambda s: s.name
)
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Size, Path]:
    size: Size = request.param
    folder = probes.save_random_model(tmp_path_factory.mktemp(size.name), dict(size.config))
    return size, folder


def _plan_row(size: Size, folder: Path, phase: Phase, role: Role, extra: list[str] | None = None) -> int:
    return _plan(size, folder, extra).row(phase, role).total_bytes


def _plan(size: Size, folder: Path, extra: list[str] | None = None) -> MemoryPlan:
    n = 2
    cfg = load_config(
        None,
        [
            f"model.path={folder}",
            f"data.max_prompt_length={size.prompt_len}",
            f"data.max_response_length={size.response_len}",
            f"data.train_batch_size={size.micro}",
            f"rollout.n={n}",
            f"actor.mini_batch_size={size.micro}",
            f"actor.micro_batch_size_per_device={size.micro}",
            f"actor.logprobs.micro_batch_size_per_device={size.micro}",
            "actor.mixed_precision=float32",
            *(extra or []),
        ],
    )
    return estimate_memory(cfg, device="cpu")


def _check(name: str, planned: int, measured: int) -> None:
    ratio = planned / measured
    print(f"{name}: planned {format_bytes(planned)}, measured {format_bytes(measured)}, ratio {ratio:.2f}")  # noqa: T201 (-s shows the figures)
    allowed = max(TOLERANCE * measured, NOISE_BYTES)
    assert abs(planned - measured) <= allowed, (
        f"{name}: planned {planned} vs measured {measured} "
        f"(ratio {ratio:.2f}; allowed difference {allowed:.0f})"
    )


def _measured(probe: Callable[..., int], size: Size, folder: Path, *args: object) -> int:
    """Median peak RSS increase of `probe(folder, *args, prompt_len, response_len, vocab)`, each run in a
    fresh process."""
    shape = (size.prompt_len, size.response_len, int(size.config["vocab_size"]))
    runs = [measure_peak_rss(probe, str(folder), *args, *shape).increase_bytes for _ in range(size.repeats)]
    return int(statistics.median(runs))


def test_actor_update_peak(model: tuple[Size, Path]) -> None:
    size, folder = model
    measured = _measured(probes.update, size, folder, False, "float32", False, size.micro)
    _check(f"{size.name} actor update", _plan_row(size, folder, Phase.UPDATE_ACTOR, Role.ACTOR), measured)


@pytest.mark.slow  # CI keeps the actor update and generation checks (the suite's time)
def test_critic_update_peak(model: tuple[Size, Path]) -> None:
    size, folder = model
    measured = _measured(probes.update, size, folder, True, "float32", False, size.micro)
    critic = [
        "algorithm.adv_estimator=gae",
        f"critic.mini_batch_size={size.micro}",
        f"critic.micro_batch_size_per_device={size.micro}",
        "critic.mixed_precision=float32",
    ]
    planned = _plan_row(size, folder, Phase.UPDATE_CRITIC, Role.CRITIC, critic)
    _check(f"{size.name} critic update", planned, measured)


@pytest.mark.slow  # CI keeps the actor update and generation checks (the suite's time)
def test_old_logprob_peak(model: tuple[Size, Path]) -> None:
    size, folder = model
    measured = _measured(probes.old_logprobs, size, folder, "float32", size.micro)
    _check(f"{size.name} old log-probs", _plan_row(size, folder, Phase.OLD_LOG_PROB, Role.ACTOR), measured)


# slow (CI time): the actor update and old log-prob peaks stay in CI
@pytest.mark.slow
def test_rollout_generation_peak(model: tuple[Size, Path]) -> None:
    size, folder = model
    prompts, n, seqs = size.micro // 2, 2, size.micro
    measured = _measured(probes.rollout_generate, size, folder, seqs, prompts, n)
    planned = _plan_row(size, folder, Phase.GEN, Role.ROLLOUT, [f"rollout.max_num_seqs={seqs}"])
    _check(f"{size.name} rollout generation", planned, measured)


MOE = Size(
    "moe",
    {
        "hidden_size": 64,
        "intermediate_size": 256,
        "moe_intermediate_size": 128,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 2048,
        "tie_word_embeddings": True,
    },
    micro=16,
    prompt_len=64,
    response_len=64,
    repeats=3,
)
"""A tiny Qwen3-MoE (8 experts, 2 per token): its activations are planned from the active width and the
router's tensors (`planning.activations`); planned / measured was 0.86-0.94 (update) and 0.83-0.92 (old
log-probs) over two runs of three here."""


@pytest.mark.slow  # the dense model's checks stay in CI; this one repeats them on a mixture of experts
@pytest.mark.parametrize("phase", [Phase.UPDATE_ACTOR, Phase.OLD_LOG_PROB])
def test_moe_actor_peaks(phase: Phase, tmp_path: Path) -> None:
    folder = probes.save_random_moe(tmp_path, dict(MOE.config))
    if phase is Phase.UPDATE_ACTOR:
        measured = _measured(probes.update, MOE, folder, False, "float32", False, MOE.micro)
    else:
        measured = _measured(probes.old_logprobs, MOE, folder, "float32", MOE.micro)
    _check(f"moe {phase}", _plan_row(MOE, folder, phase, Role.ACTOR), measured)


# ---- world 2: two gloo ranks of the actor engine, data parallel, sequence parallel, tensor parallel ------

WORLD2 = Size(
    "world2",
    {
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "tie_word_embeddings": True,
    },
    micro=4,
    prompt_len=32,
    response_len=224,
    repeats=1,
)
"""Long rows (256 tokens, most of them response) so that activations and logits are most of a rank's peak
and the sequence split shows: 4 rows per rank, micro-batches of 4 rows of the group."""

_NO_TP_REASON = (
    "EngineSpec has no tensor_parallel_size field yet: the tensor-parallel engine is built on another "
    "branch; this case measures it once that is merged"
)


@pytest.fixture(scope="module")
def world2_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return probes.save_random_model(tmp_path_factory.mktemp("world2"), dict(WORLD2.config))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _measured_world2(folder: Path, sp: int, tp: int) -> int:
    """The larger of the two ranks' peak RSS increases, both ranks running at once in fresh processes."""
    size = WORLD2
    shape = (size.prompt_len, size.response_len, int(size.config["vocab_size"]))
    port = _free_port()
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [
            pool.submit(
                measure_peak_rss, probes.update_rank, str(folder), rank, 2, port, sp, tp, size.micro, *shape
            )
            for rank in range(2)
        ]
        return max(r.result().increase_bytes for r in runs)


def _plan_world2(folder: Path, sp: int, tp: int) -> int:
    size = WORLD2
    extra = [
        "cluster.bundles_per_node=2",
        "model.remove_padding=true",
        "model.fused_head=false",
        f"model.sequence_parallel_size={sp}",
        f"model.tensor_parallel_size={tp}",
    ]
    # train_batch_size x rollout.n rows over 2 ranks: `micro` rows per rank, as the probe gives each
    return _plan_row(size, folder, Phase.UPDATE_ACTOR, Role.ACTOR, extra)


@pytest.mark.slow  # two 2-process gloo runs (~1 min on 2 busy cores)
def test_world2_dp_and_sp_update_peaks(world2_model: Path) -> None:
    """Per-rank peaks of 2-rank engines next to the plan: data parallel (each rank its own rows) and
    sequence parallel (the two ranks pool their rows and each runs half of every micro-batch's tokens)."""
    dp2 = _measured_world2(world2_model, 1, 1)
    _check("world 2 dp2 actor update", _plan_world2(world2_model, 1, 1), dp2)
    sp2 = _measured_world2(world2_model, 2, 1)
    _check("world 2 sp2 actor update", _plan_world2(world2_model, 2, 1), sp2)
    assert sp2 < dp2, f"sequence parallelism should lower a rank's peak: sp2 {sp2} vs dp2 {dp2}"


@pytest.mark.slow
@pytest.mark.skipif(not probes.engine_has_tensor_parallel(), reason=_NO_TP_REASON)
def test_world2_tp_update_peak(world2_model: Path) -> None:
    """A 2-rank tensor-parallel engine's per-rank peak next to the plan."""
    measured = _measured_world2(world2_model, 1, 2)
    _check("world 2 tp2 actor update", _plan_world2(world2_model, 1, 2), measured)


# ---- world 2, mixture of experts: expert parallelism over both ranks -----------------------------------

MOE_EP = Size(
    "moe_ep",
    {
        "hidden_size": 128,
        "intermediate_size": 512,
        "moe_intermediate_size": 256,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "tie_word_embeddings": True,
    },
    micro=4,
    prompt_len=32,
    response_len=224,
    repeats=1,
)
"""The MoE of benchmarks/expert_parallel.py (16 experts, top-2, expert width 256, 4 layers): the routed
experts are 6.3M of its 7.0M parameters, so a rank's states and FSDP2's gathered layers are mostly experts;
rows as WORLD2's. Planned / measured (the larger rank) was 1.02-1.05 (ep 2 update), 0.89-0.92 (ep 2
old log-probs) and 0.95-0.96 (ep 1 update) over two runs here."""


def _measured_moe_ep(folder: Path, ep: int, update_phase: bool) -> tuple[int, int]:
    """(the larger rank's peak RSS increase, the expert weight bytes rank 0 holds), both ranks at once."""
    size = MOE_EP
    shape = (size.prompt_len, size.response_len, int(size.config["vocab_size"]))
    port = _free_port()
    args = (2, port, ep, update_phase, size.micro, *shape)
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [pool.submit(measure_peak_rss, probes.moe_rank, str(folder), r, *args) for r in (0, 1)]
        done = [r.result() for r in runs]
    return max(m.increase_bytes for m in done), int(done[0].result)


@pytest.mark.slow  # three 2-process gloo runs of an MoE engine (~1-2 min on 2 busy cores)
def test_world2_moe_expert_parallel_peaks(tmp_path: Path) -> None:
    """Two ranks at ep 2 (each holds 8 of 16 experts per layer; nothing of them is FSDP-sharded further):
    the update's and the old-log-prob pass's per-rank peaks next to the plan, the plan's expert weights
    next to what the engine holds; and the update at ep 1 (FSDP2 over both ranks), for comparison."""
    size = MOE_EP
    folder = probes.save_random_moe(tmp_path, dict(size.config))
    extra = ["cluster.bundles_per_node=2", "model.remove_padding=true", "model.fused_head=false"]
    for ep, phase in ((2, Phase.UPDATE_ACTOR), (2, Phase.OLD_LOG_PROB), (1, Phase.UPDATE_ACTOR)):
        measured, expert_bytes = _measured_moe_ep(folder, ep, phase is Phase.UPDATE_ACTOR)
        ep_extra = [*extra, f"model.expert_parallel_size={ep}"]
        plan = _plan(size, folder, ep_extra)
        _check(f"world 2 moe ep{ep} {phase}", plan.row(phase, Role.ACTOR).total_bytes, measured)
        held = plan.sizes["experts_per_rank"] * 4 * 3 * 128 * 256 * 4  # experts x layers x 3 H I x float32
        assert plan.sizes["experts_per_rank"] == 8  # 16 / ep over 2 / ep ranks of "edp": 8 either way
        assert expert_bytes == held, f"ep{ep}: the engine holds {expert_bytes} B of experts, planned {held}"


# ---- the LM head on packed rows: plain logits or the fused head --------------------------------------------

VOCAB32K = Size(
    "vocab32k",
    {**WORLD2.config, "vocab_size": 32768},
    micro=8,
    prompt_len=32,
    response_len=224,
    repeats=1,
)
"""A 32k vocabulary over 1,792 response positions: the plain head's logits (224 MiB per float32 copy) are
most of the peak, and large enough that freed copies go back to the OS (no heap noise)."""


@pytest.mark.slow  # two fresh-process updates of ~0.5-0.8 GB each (~1 min on 2 busy cores)
def test_packed_update_plain_and_fused_head_peaks(tmp_path: Path) -> None:
    """One rank, packed rows: the plain head's logits and the fused head's blocks next to the plan."""
    size = VOCAB32K
    folder = probes.save_random_model(tmp_path / "model", dict(size.config))
    shape = (size.prompt_len, size.response_len, int(size.config["vocab_size"]))
    peaks = {}
    for fused in (False, True):
        args = (str(folder), 0, 1, 0, 1, 1, size.micro, *shape)
        measured = measure_peak_rss(probes.update_rank, *args, fused=fused).increase_bytes
        extra = ["model.remove_padding=true", f"model.fused_head={str(fused).lower()}"]
        planned = _plan_row(size, folder, Phase.UPDATE_ACTOR, Role.ACTOR, extra)
        _check(f"packed update, {'fused' if fused else 'plain'} head", planned, measured)
        peaks[fused] = measured
    assert peaks[True] < peaks[False], f"the fused head should lower the peak: {peaks}"
