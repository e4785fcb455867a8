"""`quartet export`: a run checkpoint's policy as a Hugging Face folder that `from_pretrained` loads.

    export_checkpoint(Path("runs/quartet/demo/checkpoints/global_step_100"), Path("out"), lora="merge")

The actor is rebuilt in this process, one rank, from the checkpoint's own config and base model folder, its
sharded state is loaded (DCP reshards from the run's world size to one), and then:
- `lora="merge"` (and every non-LoRA run): the full model, LoRA folded into the base weights, plus the
  tokenizer files: what the trainer itself exports at the end of a run;
- `lora="adapter"`: only the adapter (peft's `adapter_config.json` + `adapter_model.safetensors`) plus the
  tokenizer, to load over the base model with `peft.PeftModel.from_pretrained(base, out)`; the folder's
  `base_model.txt` names the base model folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Literal

from quartet.config import Role
from quartet.config.loader import load_saved_config
from quartet.engines.checkpoint import TOKENIZER_FILES
from quartet.tracking.run_layout import CONFIG_FILE, TRAINER_STATE_FILE
from quartet.trainer.recovery.checkpoint import CheckpointError, find_resume_checkpoint

__all__ = ["export_checkpoint", "resolve_checkpoint"]

LoraExport = Literal["merge", "adapter"]


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder as given, or the latest checkpoint of a run folder."""
    if (path / TRAINER_STATE_FILE).exists():
        return path
    found = find_resume_checkpoint(str(path), path)
    if found is None:
        raise CheckpointError(f"{path} holds no checkpoint")
    return found


def export_checkpoint(checkpoint: Path, out: Path, lora: LoraExport = "merge") -> Path:
    """Write the policy of `checkpoint` (a `global_step_N` folder or a run folder) to `out`; returns `out`."""
    checkpoint = resolve_checkpoint(checkpoint)
    state = json.loads((checkpoint / TRAINER_STATE_FILE).read_text())
    cfg = load_saved_config(checkpoint / CONFIG_FILE)
    has_lora = cfg.model.lora.rank > 0
    if lora == "adapter" and not has_lora:
        raise ValueError(f"{checkpoint} was trained without LoRA (model.lora.rank=0): no adapter to export")
    model_path = Path(state["model_path"])
    if not (model_path / "config.json").exists():
        raise CheckpointError(
            f"the checkpoint's base model folder {model_path} is gone; the export rebuilds the actor from it"
        )
    for key, value in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)  # one rank in this process
    from quartet.roles.actor import Actor
    from quartet.trainer.workers.start import run_values

    actor = Actor(cfg.actor, run_values(cfg, str(model_path)), lora=cfg.model.lora)
    actor.engine.load(checkpoint / Role.ACTOR)  # the folder `save_roles` wrote
    if lora == "merge":
        actor.engine.export_hf(out)
        return out
    out.mkdir(parents=True, exist_ok=True)
    module: Any = actor.engine.module  # a peft model (its adapter only); typed nn.Module by the engine
    module.save_pretrained(str(out))
    for name in TOKENIZER_FILES:
        if (model_path / name).exists():
            shutil.copy(model_path / name, out / name)
    (out / "base_model.txt").write_text(f"{model_path}\n")
    return out
