"""Keeping transformers quiet under the commands that load models (train, sft, demo, export).

Their console shows quartet's own progress; transformers' info/warning logs and tqdm download bars would
interleave with it and bury it. One helper, so every command silences the same things.
"""

from __future__ import annotations

import logging

__all__ = ["quiet_transformers"]


def quiet_transformers() -> None:
    """Only errors from transformers' loggers, and no progress bars (transformers' nor the hub's)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(logging.ERROR)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated in transformers
