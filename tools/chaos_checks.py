"""End checks of the chaos soak (`tools/chaos_soak.py`), each recomputed from the run folder's own files.

- steps: every step 1..N has exactly one `step` record in `metrics.jsonl` (records of steps a resume redid
  sit in `metrics.superseded.jsonl`), and `checkpoints/latest` names step N;
- prompts: `rollouts/step_K.jsonl` (`trainer.rollout_freq=1`, `trainer.rollout_samples=0`: every row)
  names the dataset row of each sample; step K must hold exactly its B rows of its epoch's shuffle
  (offset (K-1)B, epochs of n // B * B rows), recomputed here with numpy as the sampler documents it
  (`default_rng(seed + epoch).permutation(n)`), each `rollout.n` times: nothing skipped, nothing
  repeated within an epoch, whatever resumes happened;
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
        # "\n" only: str.splitlines also cuts at U+0085, U+2028, \x0b..., which a sampled response written
        # unescaped (rollout records) may hold, and half a record is no record
        for line in path.read_text().split("\n"):
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
    """Each step drew exactly its slice of its epoch's order, each prompt `n` times (see module doc)."""
    per_epoch = rows // batch * batch  # drop_last: the rows an epoch serves
    orders: dict[int, np.ndarray] = {}
    bad: list[str] = []
    seen: Counter[tuple[int, int]] = Counter()  # (epoch, row): a row comes back once per epoch
    for step in range(1, total + 1):
        epoch, start = divmod((step - 1) * batch, per_epoch)
        if epoch not in orders:
            orders[epoch] = np.random.default_rng(seed + epoch).permutation(rows)
        path = run_dir / "rollouts" / f"step_{step}.jsonl"
        got = Counter(int(r["index"]) for r in _records(path))
        want = Counter({int(i): n for i in orders[epoch][start : start + batch]})
        seen.update((epoch, i) for i in got)
        if got != want:
            bad.append(f"step {step}: drew {sorted(got.items())}, expected {sorted(want.items())}")
    repeats = sorted(key for key, c in seen.items() if c > 1)
    return {
        "passed": not bad and not repeats,
        "prompts": len(seen),
        "epochs": len(orders),
        "wrong_steps": bad[:10],
        "prompts_twice_in_an_epoch": repeats[:20],
    }


def same_weights(a: Path, b: Path) -> list[str]:
    """Names of the tensors that differ between two safetensors files (both must hold the same names)."""
    import torch
    from safetensors.torch import load_file

    left, right = load_file(str(a)), load_file(str(b))
    if left.keys() != right.keys():
        return sorted(set(left) ^ set(right))
    return [k for k in left if not torch.equal(left[k], right[k])]


def recheck_prompts(out: Path, run_dir: Path, batch: int, n: int, rows: int, seed: int) -> bool:
    """Recompute the prompt check of a finished soak (run with `--keep`) from its kept run folder, after a
    fix of the check itself; the result as run stays under `prompts_as_run`. Whether all checks pass."""
    result = json.loads(out.read_text())
    checks = result["checks"]
    total = checks["steps"]["steps"]
    checks.setdefault("prompts_as_run", checks["prompts"])
    checks["prompts"] = {
        **check_prompts(run_dir, total, batch, n, rows, seed),
        "note": "recomputed from the kept run folder by --recheck-prompts (see prompts_as_run)",
    }
    named = all(
        f["named_after_s"] is not None and f["recovered_after_s"] is not None for f in result["faults"]
    )
    result["passed"] = named and all(c["passed"] for k, c in checks.items() if k != "prompts_as_run")
    out.write_text(json.dumps(result, indent=1) + "\n")
    return bool(result["passed"])
