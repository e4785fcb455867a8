"""TensorBoard: one scalar per numeric metric at the record's step, in `<run dir>/tensorboard/`.

Uses torch's `SummaryWriter` (torch is a dependency already; the `tensorboard` package provides the event
file format). Validation metrics arrive prefixed `val-core/...` and are written as they are. The resolved
config goes in once as hyper-parameters (HPARAMS tab, flattened keys) and as JSON text (TEXT tab). The
writer is flushed after every record with a step, so a crash keeps what was logged.

    tensorboard --logdir <run dir>/tensorboard
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quartet.tracking.sink import flatten_config, numeric_metrics, record_step

__all__ = ["TensorBoardSink"]


def _hparam_value(value: Any) -> bool | int | float | str:
    """TensorBoard hparams take bool/int/float/str; anything else (lists, None) goes in as its JSON text."""
    return value if isinstance(value, bool | int | float | str) else json.dumps(value)


class TensorBoardSink:
    """Scalars per step; see the module docstring."""

    def __init__(self, log_dir: Path, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir))
        if config:
            flat = {key: _hparam_value(value) for key, value in flatten_config(config).items()}
            file_writer = self._writer.file_writer
            assert file_writer is not None  # SummaryWriter opens it in __init__
            for summary in hparams(flat, {}):  # the experiment, session-start and session-end protos
                file_writer.add_summary(summary)
            self._writer.add_text("config", "```json\n" + json.dumps(config, indent=2) + "\n```")
        self._writer.flush()

    def log(self, record: Mapping[str, Any]) -> None:
        step = record_step(record)
        if step is None:
            return
        for key, value in numeric_metrics(record).items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def phase(self, name: str) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        self._writer.close()
