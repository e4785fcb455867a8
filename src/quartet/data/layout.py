"""Writing rows in verl's RL dataset layout (what `PromptDataset` reads), shared by tasks and converters.

One row:
    {"data_source": str, "prompt": [{"role": "user", "content": ...}], "ability": str,
     "reward_model": {"style": "rule", "ground_truth": str}, "extra_info": {"split": str, "index": int, ...}}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["rl_row", "write_parquet"]


def rl_row(
    messages: list[dict[str, str]],
    data_source: str,
    ground_truth: str,
    *,
    index: int,
    split: str,
    ability: str = "",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One row of the layout; `extra` is merged into `extra_info` after `split` and `index`."""
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, **(extra or {})},
    }


def write_parquet(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write `rows` (dicts with the same columns) as one parquet file; its path. Parent folders are made."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([dict(r) for r in rows]), path)
    return path
