"""benchmarks/async_throughput.py's long workload and splits, without running them: the config they build is
valid (the long workload's sizes divide, the splits name pools that exist), and the summary derives the
ratio, the sync step's generation share and overlap ceiling, and the samples dropped from the rows."""

from __future__ import annotations

import pytest
from async_throughput import long_overrides, split_mode, summarise

from quartet.demo.pipeline import demo_config


@pytest.mark.parametrize(("length", "prompts"), [(320, 2), (192, 8)])
def test_the_long_workload_config_is_valid(length: int, prompts: int) -> None:
    label, split = split_mode("2:1")
    assert label == "async@2:1"
    cfg = demo_config([*long_overrides(length, prompts), *split], 0, quick=False)
    assert cfg.data.builtin_task.value == "counting" and cfg.data.max_response_length == length
    assert cfg.data.train_batch_size == prompts and cfg.rollout.n == 4
    assert cfg.model.tiny.max_position_embeddings >= 64 + length
    assert (cfg.cluster.pool_cpus.rollout, cfg.cluster.pool_cpus.main) == (2, 1)


def row(mode: str, seed: int, rate: float, **extra: float) -> dict[str, object]:
    base = {"mode": mode, "seed": seed, "samples_per_s": rate, "steps_per_min": 1.0, "accuracy": 0.0}
    base |= {"score": 0.1, "overlap": None, "staleness_mean": None, "dropped_stale": 0.0}
    return base | {"trainer_idle_s": None, "rollout_idle_s": None} | extra


def test_the_summary_carries_the_ceiling_and_the_drops() -> None:
    rows = [
        row("sync_separate", 0, 2.0, gen_share=0.7, overlap_ceiling=1.4),
        row("sync_separate", 1, 4.0, gen_share=0.6, overlap_ceiling=1.6),
        row("async", 0, 3.0, dropped_stale=8.0),
        row("async", 1, 4.0, dropped_stale=4.0),
    ]
    s = summarise(rows)
    assert s["async"]["ratio_by_seed"] == pytest.approx([1.5, 1.0])  # per seed, against its own baseline
    assert s["async"]["ratio_to_sync_separate"] == pytest.approx(1.25)
    assert s["async"]["dropped_stale"] == 12.0
    assert s["async"]["sync_gen_share"] == pytest.approx(0.65)
    assert s["async"]["sync_overlap_ceiling"] == pytest.approx(1.5)
    assert s["sync_separate"]["ratio_to_sync_separate"] == pytest.approx(1.0)
