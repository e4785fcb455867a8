"""The run folder's layout: the name of every file and folder a run writes, and the rollout tables' columns.

    <run dir>/
      config.yaml                      the resolved config (also in each checkpoint)
      metrics.jsonl                    every record; metrics.superseded.jsonl: records a resumed run redid;
                                       metrics.<unix time>.jsonl: an earlier run's file, set aside
      bad_rows.jsonl                   every row skipped at load or scored 0 by a failed score call
      cluster.json                     the run's Ray names and where each rank ran
      run_state.json                   running, finished or failed
      hang_<N>.txt                     every rank's Python stacks when a phase of step N passed its deadline
      data/<task>/                     the built-in task's data sets
      rollouts/step_<N>.jsonl          recorded samples, one line each (val_step_<N>.jsonl: validation)
      rollouts/step_<N>.parquet        the same samples as a table, with per-token columns
      rollouts/images/<sha256>.<ext>   the recorded samples' images, each once (named by its content)
      checkpoints/latest               the name of the newest complete checkpoint
      checkpoints/global_step_<N>/     trainer_state.json, config.yaml, one folder per role, manifest.json
      hf/                              the exported model
      plots.png                        `quartet plot`
      summary.json                     an SFT run's result

The writers (trainer, tracking, cluster, sft) and the readers (inspector, cli, doctor) name files through
this module only, so a reader never imports the writer's package for a name. It sits low (it imports
nothing of quartet) so that every layer can.
"""

from __future__ import annotations

import re

__all__ = [
    "BAD_ROWS_FILE",
    "CHECKPOINTS_DIR",
    "CHECKPOINT_GLOB",
    "CLUSTER_FILE",
    "CONFIG_FILE",
    "DATA_DIR",
    "HF_DIR",
    "IMAGE_TYPES",
    "LATEST_FILE",
    "MANIFEST_FILE",
    "METRICS_FILE",
    "PLOTS_FILE",
    "ROLLOUTS_DIR",
    "ROLLOUT_IMAGES_DIR",
    "ROLLOUT_TABLE_GLOB",
    "RUN_STATE_FILE",
    "SUMMARY_FILE",
    "SUPERSEDED_METRICS_FILE",
    "TOKEN_COLUMNS",
    "TOKEN_LIST_COLUMNS",
    "TRAINER_STATE_FILE",
    "checkpoint_name",
    "checkpoint_step",
    "hang_file",
    "rollout_image_file",
    "rollout_image_name",
    "rollout_records_file",
    "rollout_table_file",
    "rollout_table_step",
    "set_aside_metrics_file",
]

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUPERSEDED_METRICS_FILE = "metrics.superseded.jsonl"
BAD_ROWS_FILE = "bad_rows.jsonl"
CLUSTER_FILE = "cluster.json"
RUN_STATE_FILE = "run_state.json"
DATA_DIR = "data"
HF_DIR = "hf"
PLOTS_FILE = "plots.png"
SUMMARY_FILE = "summary.json"


def hang_file(step: int) -> str:
    """The stacks file of step `step`'s hang (`quartet.cluster.watchdog`)."""
    return f"hang_{step}.txt"


CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "latest"
"""In `checkpoints/`: one line, the name of the newest complete checkpoint."""
CHECKPOINT_GLOB = "global_step_*"
_CHECKPOINT = re.compile(r"^global_step_(\d+)$")
TRAINER_STATE_FILE = "trainer_state.json"
"""In a checkpoint folder: the driver's state; a folder without it is no complete checkpoint."""
MANIFEST_FILE = "manifest.json"
"""In a checkpoint folder, written last: every other file's size and sha256 (`trainer.recovery.manifest`)."""

ROLLOUTS_DIR = "rollouts"
ROLLOUT_TABLE_GLOB = "step_*.parquet"
_ROLLOUT_TABLE = re.compile(r"^step_(\d+)\.parquet$")

ROLLOUT_IMAGES_DIR = "images"
"""In `rollouts/`: the images of recorded samples, `<sha256 of the bytes>.<ext>`, written once each."""
IMAGE_TYPES = {"png": "image/png", "jpg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
"""The image files a run keeps (by extension) and the content type each is served with."""
_ROLLOUT_IMAGE = re.compile(r"^[0-9a-f]{64}\.(png|jpg|gif|webp)$")

TOKEN_COLUMNS = {
    "logprobs": "old_logprobs",
    "rollout_logprobs": "rollout_logprobs",
    "ref_logprobs": "ref_logprobs",
    "entropy": "entropy",
    "advantages": "advantages",
    "values": "values",
    "versions": "rollout_versions",
}
"""Per-token float columns of a rollout table and the batch column each comes from (when the step has
it)."""
TOKEN_LIST_COLUMNS = ("token_ids", "token_text", "mask")
"""The per-token columns every table with tokens has: ids, each token's text, the loss mask."""


def set_aside_metrics_file(stamp: int) -> str:
    """The name an earlier run's metrics file gets when a fresh start finds it (`stamp`: unix seconds)."""
    return f"metrics.{stamp}.jsonl"


def checkpoint_name(step: int) -> str:
    """The folder of the checkpoint saved after `step`, in `checkpoints/`."""
    return f"global_step_{step}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder's name; None for any other name."""
    match = _CHECKPOINT.match(name)
    return int(match.group(1)) if match else None


def rollout_records_file(step: int, val: bool = False) -> str:
    """The JSONL file of a recorded step's samples (of its validation with `val`), in `rollouts/`."""
    return f"{'val_' if val else ''}step_{step}.jsonl"


def rollout_table_file(step: int) -> str:
    """The parquet table of a recorded step's samples, in `rollouts/`."""
    return f"step_{step}.parquet"


def rollout_image_file(digest: str, ext: str) -> str:
    """An image's path relative to the run folder (what a record names): `rollouts/images/<digest>.<ext>`."""
    name = f"{digest}.{ext}"
    if not _ROLLOUT_IMAGE.fullmatch(name):
        raise ValueError(f"an image file is <sha256 hex>.<{'|'.join(IMAGE_TYPES)}>, got {name!r}")
    return f"{ROLLOUTS_DIR}/{ROLLOUT_IMAGES_DIR}/{name}"


def rollout_image_name(path: str) -> str | None:
    """The file name of a record's image path (`rollouts/images/<sha256>.<ext>`, nothing else: no `..`, no
    absolute path, no other folder); None for any other path."""
    parts = path.split("/")
    if len(parts) != 3 or parts[:2] != [ROLLOUTS_DIR, ROLLOUT_IMAGES_DIR]:
        return None
    return parts[2] if _ROLLOUT_IMAGE.fullmatch(parts[2]) else None


def rollout_table_step(name: str) -> int | None:
    """The step of a rollout table's file name; None for any other name."""
    match = _ROLLOUT_TABLE.match(name)
    return int(match.group(1)) if match else None
