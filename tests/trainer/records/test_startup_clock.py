"""The startup record: time set aside before the trainer (an SFT warm start) is its own phase, not imports."""

from __future__ import annotations

from quartet.trainer.records.startup import StartupClock


def test_a_warm_start_is_set_aside_from_the_imports_and_kept_in_the_total() -> None:
    clock = StartupClock()
    clock.imports_s = 150.0  # as if the process imported quartet 150 s ago, 140 s of it an SFT warm start
    before = clock.report(first_step_s=1.0)
    clock.set_aside("sft_warm_start", 140.0)
    after = clock.report(first_step_s=1.0)
    assert after["imports_s"] == 10.0 and after["sft_warm_start_s"] == 140.0
    # the span from the first import to the first step is the same length: nothing is hidden
    assert abs(after["to_first_step_end_s"] - before["to_first_step_end_s"]) < 0.01
    assert after["to_first_step_end_s"] >= 150.0
