"""The run folder's names: one module that writers and readers share, low enough for every layer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from quartet.tracking import run_layout
from quartet.tracking.run_layout import (
    checkpoint_name,
    checkpoint_step,
    rollout_records_file,
    rollout_table_file,
    rollout_table_step,
)


def test_file_names_parse_back() -> None:
    for step in (0, 7, 120):
        assert rollout_table_step(rollout_table_file(step)) == step
        assert checkpoint_step(checkpoint_name(step)) == step
    assert rollout_table_step(rollout_records_file(3)) is None
    assert rollout_table_step("step_3.parquet.tmp") is None and checkpoint_step(".tmp-global_step_3") is None
    assert rollout_records_file(3, val=True) == "val_" + rollout_records_file(3)
    assert checkpoint_name(4).startswith(run_layout.CHECKPOINT_GLOB.rstrip("*"))


def test_layout_imports_nothing_of_quartet_and_the_inspector_no_trainer() -> None:
    code = (
        "import sys, quartet.tracking.run_layout, quartet.inspector.run_data\n"
        "print(sorted(m for m in sys.modules if m.startswith('quartet.trainer')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    source = Path(run_layout.__file__).read_text()
    assert "import quartet" not in source and "from quartet" not in source
