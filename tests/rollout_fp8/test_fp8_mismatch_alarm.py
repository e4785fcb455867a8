"""The log-prob mismatch alarm next to an fp8 engine: the low-precision threshold whatever the trainer's
dtype (fp8 rounding is expected, TIS corrects it), and when it trips, fp8 named first among the causes."""

from __future__ import annotations

import torch

from quartet.config import load_config
from quartet.core.batch import Batch
from quartet.trainer.loop.mismatch_alarm import FP32_MAX_ABS_DIFF, LOW_PRECISION_MAX_ABS_DIFF, MismatchWatch

FLOAT32_TRAINER = ["cluster.backend=local", "actor.mixed_precision=float32"]


def _batch(gap: float) -> Batch:
    """4 rows of 6 tokens (the last 2 of row 0 padding), engine log-probs `gap` above the trainer's."""
    trainer = -torch.rand(4, 6, generator=torch.Generator().manual_seed(0)) - 0.5
    mask = torch.ones(4, 6)
    mask[0, 4:] = 0
    return Batch({"old_logprobs": trainer, "rollout_logprobs": trainer + gap, "response_mask": mask})


def test_an_fp8_engine_gets_the_low_precision_threshold() -> None:
    plain = MismatchWatch.from_config(load_config(None, FLOAT32_TRAINER))
    fp8 = MismatchWatch.from_config(load_config(None, [*FLOAT32_TRAINER, "rollout.quantization=fp8"]))
    assert plain.max_abs_diff == FP32_MAX_ABS_DIFF and fp8.max_abs_diff == LOW_PRECISION_MAX_ABS_DIFF
    fp8.check_logprobs(_batch(4e-3), version=0)  # the tiny model's fp8 figure: no alarm
    assert fp8.take(1) is None
    plain.check_logprobs(_batch(4e-3), version=0)  # the same gap from an unquantized float32 engine trips
    assert plain.take(1) is not None


def test_a_tripped_alarm_names_fp8_first_and_the_derivation() -> None:
    watch = MismatchWatch.from_config(load_config(None, [*FLOAT32_TRAINER, "rollout.quantization=fp8"]))
    watch.check_logprobs(_batch(0.2), version=0)
    alarm = watch.take(3)
    assert alarm is not None
    message = alarm.message()
    derived = "(trainer.mismatch_alarm_max_abs_diff, derived from float32 and the fp8 rollout)"
    assert f"0.2 > 0.05 {derived}" in message
    causes = message.split("likely causes: ", 1)[1]
    assert causes.startswith("rollout.quantization=fp8") and "actor.tis_cap" in causes
