"""The SFT warm start of `quartet train` (`trainer.sft_warm_start`): the `sft:` section first, then RL from
its exported model.

The warm start is its own run folder, `<output_dir>/<project>/<experiment_name>-sft_start`, with the usual
SFT files; the RL run's `model.path` becomes its `hf` folder. When that folder already holds an exported
model (a rerun, or a resumed RL run), it is reused rather than trained again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quartet.config import QuartetConfig
from quartet.tracking.run_layout import HF_DIR

__all__ = ["sft_warm_start", "warm_start_dir"]


def warm_start_dir(cfg: QuartetConfig) -> Path:
    """The warm start's run folder."""
    t = cfg.trainer
    return Path(t.output_dir) / t.project_name / f"{t.experiment_name}-sft_start"


def sft_warm_start(
    cfg: QuartetConfig, on_record: Callable[[dict[str, Any]], None] | None = None
) -> tuple[QuartetConfig, Path, bool]:
    """(the RL config starting from the warm start, its model folder, whether it was trained now)."""
    from quartet.sft import SFTTrainer

    run_dir = warm_start_dir(cfg)
    hf = run_dir / HF_DIR
    trained = not (hf / "config.json").is_file()
    if trained:
        trainer = dataclasses.replace(
            cfg.trainer, experiment_name=run_dir.name, resume="off", sft_warm_start=False
        )
        hf = SFTTrainer(dataclasses.replace(cfg, trainer=trainer), on_record=on_record).run().hf_dir
    model = dataclasses.replace(cfg.model, path=str(hf))
    return dataclasses.replace(cfg, model=model), Path(hf), trained
