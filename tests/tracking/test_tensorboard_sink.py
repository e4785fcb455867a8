"""TensorBoard sink: scalars read back from the event files with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.tracking import Tracking

pytest.importorskip("tensorboard", reason="the tracking extra (tensorboard) is not installed")


def test_scalars_read_back_at_their_steps(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = {"algorithm": {"adv_estimator": "grpo", "gamma": 1.0}, "data": {"files": ["a", "b"]}}
    with Tracking(["tensorboard"], tmp_path, "quartet", "t", config, total_steps=3) as tracking:
        tracking.log({"kind": "data", "train": {"rows": 3}})
        tracking.log({"kind": "val", "step": 0, "val-core/arith/reward/mean@1": 0.125})
        for step, score in [(1, 0.5), (2, 0.25), (3, 0.75)]:
            tracking.log({"kind": "step", "step": step, "critic/score/mean": score, "tag": "skip me"})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert sorted(scalars) == ["critic/score/mean", "val-core/arith/reward/mean@1"]
    events = acc.Scalars("critic/score/mean")
    assert [(e.step, e.value) for e in events] == [(1, 0.5), (2, 0.25), (3, 0.75)]
    assert [(e.step, e.value) for e in acc.Scalars("val-core/arith/reward/mean@1")] == [(0, 0.125)]
    assert any("config" in tag for tag in acc.Tags()["tensors"])  # the config as text
