"""What the chaos soak runs and looks for: the fault kinds, the async run's settings, and the log line that
names each fault (`tools/chaos_soak.py`)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = (
    *("actor_host", "rollout_replica", "reward_worker", "driver", "hang", "disk_full", "torn_metrics"),
    "preempt",  # tools/chaos_preempt.py
    "resize",  # tools/chaos_resize.py
)
DRIVER_KILLS = ("driver", "torn_metrics", "resize")  # the driver SIGKILLed; the resumed run names the fault
RESTARTS = {"actor_host", "driver", "hang", "disk_full", "torn_metrics", "resize"}
# A killed rollout replica is restarted by the run itself (`rollout.max_replica_restarts`): no resume. The
# soak's run may restart them as often as the soak kills them (a driver process past its limit would fail
# and be resumed as a run that stopped on its own).
# A rank stopped outside a step's phases (in a checkpoint save) is bounded by this, not by the phase
# deadline: the soak waits that long for a hang to be named.
CALL_TIMEOUT_S = 180
BATCH, N, ROWS, SEED = 4, 4, 20000, 0
MAX_STEPS = 1_000_000  # never reached: the soak ends the run itself (a quiet machine trains ~10 steps/s)
ASYNC = [
    "cluster.address=local",
    "cluster.separate_pools=[rollout]",
    "cluster.cpus_per_bundle=0.5",
    f"cluster.call_timeout_s={CALL_TIMEOUT_S}",
    "rollout.max_replica_restarts=1000",
    "trainer.mode=async",
    "trainer.async_buffer=2",
    "trainer.max_staleness=2",
    f"data.train_batch_size={BATCH}",
    f"data.builtin_train_size={ROWS}",
    "data.builtin_val_size=8",
    f"data.seed={SEED}",
    "data.max_response_length=8",
    f"rollout.n={N}",
    "actor.mini_batch_size=4",
    "actor.micro_batch_size_per_device=16",
    "actor.mixed_precision=float32",
    "algorithm.adv_estimator=grpo",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.save_freq=3",
    "trainer.max_checkpoints_to_keep=2",
    "trainer.rollout_freq=1",
    "trainer.rollout_samples=0",
    "trainer.rollout_tokens=false",
    "trainer.loggers=[jsonl]",
    "trainer.export_final=false",
    "trainer.experiment_name=soak",
]


PATTERNS = {
    "actor_host": r"role .*pid {pid}\b",
    "rollout_replica": r"role .*pid {pid}\b|replica .*pid {pid}\b",
    "reward_worker": r"scoring worker pid {pid}\b",
    "driver": r"resumed from .*global_step_",
    "hang": r"passed its deadline|gave no answer within",
    "disk_full": r"No space left|Errno 28|ENOSPC",
    "torn_metrics": r"torn last line",
    "preempt": r"preemption: SIGTERM received",
    "resize": r"the world changed from",  # tools/chaos_resize.py
}
