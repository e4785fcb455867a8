"""End checks of the chaos soak (`tools/chaos_soak.py`), each recomputed from the run folder's own files.

- steps: every step 1..N has exactly one `step` record in `metrics.jsonl` (records of steps a resume redid
  sit in `metrics.superseded.jsonl`), and `checkpoints/latest` names step N;
- prompts: `rollouts/step_K.jsonl` (`trainer.rollout_freq=1`, `trainer.rollout_samples=0`: every row)
  names the dataset row of each sample; step K must hold exactly rows `order[(K-1)B : KB]` of the epoch's
  shuffle, recomputed here with numpy as the sampler documents it (`default_rng(seed + epoch)
  .permutation(n)`), each `rollout.n` times: nothing skipped, nothing repeated, whatever resumes happened;
- weights: two `hf/model.safetensors` equal tensor by tensor, bit for bit.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np


def _records(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def step_records(run_dir: Path) -> list[dict[str, Any]]:
    """The `step` records of the run's metrics file, in file order."""
    return [r for r in _records(run_dir / "metrics.jsonl") if r.get("kind") == "step"]


def latest_checkpoint(run_dir: Path) -> int:
    """The step `checkpoints/latest` names (0: none yet)."""
    path = run_dir / "checkpoints" / "latest"
    if not path.exists():
        return 0
    return int(path.read_text().strip().rsplit("_", 1)[-1])


def check_steps(run_dir: Path, total: int) -> dict[str, Any]:
    """Every step 1..total recorded exactly once, and the last checkpoint at `total`."""
    counts = Counter(int(r["step"]) for r in step_records(run_dir))
    missing = [s for s in range(1, total + 1) if counts[s] == 0]
    repeated = {s: c for s, c in counts.items() if c > 1}
    extra = sorted(s for s in counts if s > total)
    redone = Counter(int(r["step"]) for r in _records(run_dir / "metrics.superseded.jsonl") if "step" in r)
    ok = not missing and not repeated and not extra and latest_checkpoint(run_dir) == total
    return {
        "passed": ok,
        "steps": total,
        "missing": missing,
        "repeated": repeated,
        "beyond_total": extra,
        "latest_checkpoint": latest_checkpoint(run_dir),
        "steps_redone_after_resumes": sum(redone.values()),
    }


def check_prompts(run_dir: Path, total: int, batch: int, n: int, rows: int, seed: int) -> dict[str, Any]:
    """Each step drew exactly its slice of the sampler's order, each prompt `n` times (see module doc)."""
    order = np.random.default_rng(seed).permutation(rows)
    bad: list[str] = []
    if total * batch > rows:
        bad.append(f"{total} steps of {batch} pass the first epoch ({rows} rows): raise the soak's ROWS")
    seen: Counter[int] = Counter()
    for step in range(1, total + 1):
        path = run_dir / "rollouts" / f"step_{step}.jsonl"
        got = Counter(int(r["index"]) for r in _records(path))
        want = Counter({int(i): n for i in order[(step - 1) * batch : step * batch]})
        seen.update(got.keys())
        if got != want:
            bad.append(f"step {step}: drew {sorted(got.items())}, expected {sorted(want.items())}")
    repeats = sorted(i for i, c in seen.items() if c > 1)
    return {
        "passed": not bad and not repeats,
        "prompts": len(seen),
        "wrong_steps": bad[:10],
        "prompts_in_two_steps": repeats[:20],
    }


def same_weights(a: Path, b: Path) -> list[str]:
    """Names of the tensors that differ between two safetensors files (both must hold the same names)."""
    import torch
    from safetensors.torch import load_file

    left, right = load_file(str(a)), load_file(str(b))
    if left.keys() != right.keys():
        return sorted(set(left) ^ set(right))
    return [k for k in left if not torch.equal(left[k], right[k])]
