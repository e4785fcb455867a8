"""One GPU shared by two pools (`cluster.gpu_fraction`): the config accepts and refuses fractions with the
fix, and the plan counts the rollout pool's peak beside the actor's in every phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.cli.main import main
from quartet.config import ConfigError, load_config
from quartet.config.roles import Role
from quartet.planning.estimate import estimate_memory
from quartet.planning.fit import HEADROOM, Capacity, fit_config
from quartet.planning.plan import Phase

ROOT = Path(__file__).parents[2]
ASYNC = str(ROOT / "examples" / "single_gpu" / "async.yaml")
SYNC = str(ROOT / "examples" / "single_gpu" / "sync.yaml")
GiB = 2**30


def test_the_one_gpu_examples_validate_and_differ_only_in_placement_and_mode() -> None:
    shared, sync = load_config(ASYNC), load_config(SYNC)
    assert shared.cluster.sharing_pools == {"main": 0.5, "rollout": 0.5}
    assert shared.cluster.separate_pools == (Role.ROLLOUT,) and shared.trainer.mode == "async"
    assert sync.cluster.separate_pools == () and sync.trainer.mode == "sync"
    # like for like: the same model, data, sampling and optimizer
    for section in ("model", "data", "rollout", "actor", "algorithm"):
        assert getattr(shared, section) == getattr(sync, section), section
    assert load_config(ASYNC, ["trainer.mode=one_step_off"]).trainer.mode == "one_step_off"


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        (["cluster.gpu_fraction.main=0.6", "cluster.gpu_fraction.rollout=0.6"], "gpu_fraction", "= 1.2"),
        (["cluster.gpu_fraction.rollout=0"], "gpu_fraction.rollout", "(0, 1]"),
        (["cluster.gpu_fraction.main=1.5"], "gpu_fraction.main", "(0, 1]"),
        (["cluster.gpu_fraction.critic=0.5"], "gpu_fraction.critic", "no pool of its own"),
        (["cluster.bundles_per_node=2"], "gpu_fraction", "bundles_per_node=2"),
        (["cluster.device=cpu"], "gpu_fraction", "cluster.device=cpu"),
    ],
)
def test_impossible_fractions_are_refused_with_the_fix(overrides: list[str], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(ASYNC, overrides)
    assert err.value.field == f"cluster.{field}"
    assert words in err.value.problem and err.value.fix


def test_fractions_that_fill_the_gpu_exactly_are_accepted() -> None:
    cfg = load_config(ASYNC, ["cluster.gpu_fraction.main=0.7", "cluster.gpu_fraction.rollout=0.3"])
    assert cfg.cluster.sharing_pools == {"main": 0.7, "rollout": 0.3}
    assert cfg.cluster.shares_gpu("rollout") and not load_config(SYNC).cluster.shares_gpu("main")


def test_a_shared_rollout_pool_is_counted_at_its_peak_in_every_phase() -> None:
    shared = estimate_memory(load_config(ASYNC), device="gpu")
    # the same run with the rollout pool on a GPU of its own: the actor's bundle alone
    alone = estimate_memory(
        load_config(ASYNC, ["cluster.gpu_fraction.main=1", "cluster.gpu_fraction.rollout=1"]), device="gpu"
    )
    assert all(r.role != Role.ROLLOUT for r in alone.rows)
    # the rollout's generation peak, planned where it is colocated (weights, KV cache, sampling)
    gen = estimate_memory(load_config(SYNC), device="gpu").row(Phase.GEN, Role.ROLLOUT).device_bytes
    assert gen > 0
    assert shared.phases == alone.phases
    for phase in shared.phases:
        assert shared.phase_device(phase) == alone.phase_device(phase) + gen, phase
    assert any("sharing this GPU" in n and "main 0.5 + rollout 0.5" in n for n in shared.notes)


def test_the_fit_check_refuses_two_pools_that_fit_the_gpu_only_one_at_a_time() -> None:
    cfg = load_config(ASYNC, ["trainer.auto_fit=false"])
    alone = estimate_memory(
        load_config(ASYNC, ["cluster.gpu_fraction.main=1", "cluster.gpu_fraction.rollout=1"]), device="gpu"
    )
    shared = estimate_memory(cfg, device="gpu")
    between = (alone.peak_device + shared.peak_device) / 2 / HEADROOM  # the actor alone fits, both do not
    cap = Capacity("gpu", int(between), 64 * GiB, "test")
    assert not fit_config(cfg, device="gpu", capacity=cap).fits
    assert fit_config(cfg, device="gpu", capacity=Capacity("gpu", 80 * GiB, 64 * GiB, "test")).fits


def test_quartet_plan_says_the_pools_share_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", ASYNC, "--device", "gpu", "--memory-gib", "78"]) == 0
    out = capsys.readouterr().out
    assert "sharing this GPU: rollout (cluster.gpu_fraction: main 0.5 + rollout 0.5)" in out
    assert main(["plan", ASYNC, "--device", "gpu", "--memory-gib", "1"]) == 3
    code = main(["plan", ASYNC, "cluster.gpu_fraction.rollout=0.9", "--device", "gpu", "--memory-gib", "78"])
    assert code == 2
    assert "more than the whole GPU" in capsys.readouterr().err
