"""The outer loop: length of the run, cadences, outputs, resume."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from quartet.config.errors import require

__all__ = ["AlarmMode", "Logger", "StalenessControl", "TrainerConfig", "TrainerMode"]


class Logger(StrEnum):
    """Metric sinks."""

    CONSOLE = "console"
    JSONL = "jsonl"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"


class TrainerMode(StrEnum):
    """How generation and training take turns (`quartet.trainer.feed.batch_source`)."""

    SYNC = "sync"
    """Generate a batch, train on it, sync the weights, repeat: every token is on-policy."""
    ONE_STEP_OFF = "one_step_off"
    """Batch k+1 is generated (by the weights of step k-1) while the actor trains on batch k; staleness 1.
    Needs the rollout on a pool of its own (`cluster.separate_pools=[rollout]`)."""
    ASYNC = "async"
    """The rollout pool generates continuously, up to `async_buffer` batches ahead of the trainer; weights
    reach it while it generates; no trained token is older than `max_staleness` versions
    (`staleness_control`). Needs the rollout on a pool of its own."""


class StalenessControl(StrEnum):
    """How `mode=async` keeps every trained token within `max_staleness` versions
    (`quartet.trainer.feed.admission`)."""

    ADMISSION = "admission"
    """Start a step's prompts only while no token of theirs can end up older than the bound: at most
    min(async_buffer, max_staleness) batches generate ahead of the one the trainer takes; none is dropped."""
    DROP = "drop"
    """Keep `async_buffer` batches generating ahead; at each step drop the groups with a token older than the
    bound and generate them again (`async/dropped_stale`; the trainer waits for the regeneration)."""


class AlarmMode(StrEnum):
    """What a tripped check of the run's numerics does (`trainer.mismatch_alarm`)."""

    OFF = "off"
    """No check."""
    WARN = "warn"
    """Log the alarm once per step, record it (`alarm` record, `alarm/mismatch` metric) and go on."""
    STOP = "stop"
    """Record it, then end the run with the alarm's message as the error (the last completed step is
    checkpointed first, as for any failure before an update)."""


@dataclass(frozen=True)
class TrainerConfig:
    """Run length, cadences and where results go."""

    project_name: str = "quartet"
    """Project name (tracker grouping)."""

    experiment_name: str = "demo"
    """Name of this run; the run folder is `output_dir/project_name/experiment_name`."""

    output_dir: str = "runs"
    """Parent folder of projects' run folders (config, metrics, checkpoints, rollouts, cluster names)."""

    total_epochs: int = 1
    """Passes over the training data (ignored when `total_steps` > 0)."""

    total_steps: int = 0
    """Training steps of the run; 0 derives them from `total_epochs`."""

    test_freq: int = 5
    """Validate every this many steps; 0 disables periodic validation."""

    val_before_train: bool = True
    """Validate once before the first step."""

    save_freq: int = 10
    """Checkpoint every this many steps (and at the end); 0 saves only at the end. The default bounds what a
    lost node costs to 10 steps, while `max_checkpoints_to_keep` bounds the disk (verl's default is never,
    TRL's every 500 of its much shorter steps). On top of it, a failure the driver catches (a raising reward
    function, a role error, a bug) checkpoints the last completed step if every rank still answers a ping,
    then re-raises: only a step no update has touched yet, never a half-updated one (a failure during
    `update_critic`/`update_actor`/`update_weights` saves nothing; see
    `quartet.trainer.recovery.failure_save`)."""

    max_checkpoints_to_keep: int = 2
    """Keep this many most recent checkpoints; 0 keeps all."""

    resume: str = "auto"
    """`auto` (the run folder's latest checkpoint if it has one), `off` (start over), or a checkpoint folder
    (`.../checkpoints/global_step_N`)."""

    loggers: tuple[Logger, ...] = (Logger.CONSOLE, Logger.JSONL)
    """Metric sinks; JSONL is always written to the run folder."""

    seed: int = 0
    """Global seed of model init, sampling and shuffling."""

    export_final: bool = True
    """Write the final policy as a Hugging Face folder, `<run dir>/hf`, at the end of the run."""

    sft_warm_start: bool = False
    """`quartet train` first runs the `sft:` section (its built-in traces or `sft.train_files`) from the
    model, into the run `<experiment_name>-sft_start` next to this one, and trains RL from its result (the
    demos' start, for a config that is one command). A finished warm start found there is reused."""

    critic_warmup: int = 0
    """Steps at the start that update only the critic (PPO with GAE); the actor trains after them."""

    mode: TrainerMode = TrainerMode.SYNC
    """`sync`, `one_step_off` or `async` (see `TrainerMode`); the last two overlap generation with training
    and need `cluster.separate_pools` to list `rollout`."""

    max_staleness: int = 2
    """`mode=async`: the most weight versions the policy of any trained token may lag the trainer's, kept
    as `staleness_control` says. A batch generated ahead while `async_buffer` batches wait is up to
    `async_buffer` versions old, so a bound below the buffer either shortens the buffer (admission) or
    trades regenerations for freshness (drop)."""

    staleness_control: StalenessControl = StalenessControl.ADMISSION
    """`mode=async`: `admission` (start a step's prompts only while its tokens cannot exceed
    `max_staleness`: min(async_buffer, max_staleness) batches ahead, none dropped) or `drop` (`async_buffer`
    batches ahead, groups older than the bound dropped and generated again, `async/dropped_stale`)."""

    async_buffer: int = 2
    """`mode=async`: prompt batches generated ahead of the trainer at most (the bounded buffer, in flight or
    done); admission control may keep fewer (`staleness_control`)."""

    split_advice_after_steps: int = 5
    """`mode=one_step_off|async`: after this many steps, the run log prints the split advisor's
    recommendation (the rollout:trainer share of the devices and the `async_buffer` with the least idle
    time, from the steps' `timing_s/trainer_idle` and `timing_s/rollout_idle`; docs/async.md); 0: never."""

    rollout_freq: int = 0
    """Write samples (prompt, response, reward, advantage) of every this many steps to
    `<run dir>/rollouts/step_N.jsonl`, and validation generations to `val_step_N.jsonl`; 0 disables."""

    rollout_samples: int = 16
    """Samples written per step by `rollout_freq` (the first rows of the batch); 0 writes all."""

    rollout_tokens: bool = True
    """With `rollout_freq`, also write `rollouts/step_N.parquet`: the same samples with per-token values
    (token ids and text, mask, log-probs of the trainer and the engine, entropy, advantages, weight
    versions) for `quartet inspect`."""

    rollout_budget_mb: float = 1024.0
    """Largest total size of the run's per-token rollout tables; past it, steps are written without the
    per-token columns (a warning says so, and the page shows it)."""

    memory_check: bool = True
    """Before any worker starts, plan the step's memory (`quartet plan`) and refuse a run that does not fit
    the device's free memory, printing the cheapest changes that would make it fit; false skips the check."""

    auto_fit: bool = False
    """When the plan does not fit, apply the proposed changes (offload, smaller micro-batches, gradient
    checkpointing, smaller KV cache: cheapest first) instead of refusing; the applied overrides are logged."""

    hang_timeout_s: float = 0.0
    """Deadline in seconds of every phase of a step (generation, each role's pass, updates, weight sync);
    0 derives one per phase: max(600 s, 5x the longest time the phase took in earlier steps), and 1800 s
    for a phase with no earlier time (the first step). Never above `cluster.call_timeout_s`. When a phase
    passes it, every rank's Python stacks go to `<run dir>/hang_<step>.txt` and the run fails naming the
    phase, the silent ranks and their top frames (docs/reliability.md)."""

    mismatch_alarm: AlarmMode = AlarmMode.WARN
    """Check every step that the rollout engine samples from the policy the trainer trains
    (`quartet.trainer.loop.mismatch_alarm`): `warn` logs and records a tripped check, `stop` ends the run with
    it, `off` skips it. The message names the step, the phase (`recompute`: the trainer's old-log-prob pass,
    `update`: the on-policy update's forward, `drift`: the chat template's re-render), the worst samples
    and the likely causes (dtypes differ, stale or failed weight sync, template re-rendering)."""

    mismatch_alarm_max_abs_diff: float = 0.0
    """Largest mean per-token |engine - trainer| log-prob of a step (`rollout/logprob_diff_mean`) before the
    alarm trips; 0 derives it from the trainer's compute dtype (`actor.mixed_precision`): 3e-4 with
    float32 (an engine in bfloat16 trips it), 0.05 with bfloat16/float16 or an fp8 engine
    (`rollout.quantization=fp8`: 3.6e-3 on the tiny model next to a float32 trainer). Tiny model,
    16-token responses: fp32 engine and trainer 0 exactly, bf16 engine and trainer 5e-4..7.5e-4, bf16
    engine with an fp32 trainer 6e-4..7.5e-4, one skipped weight sync after an update at lr 1e-5 1.4e-3
    (1e-3: 0.1)."""

    mismatch_alarm_max_drift_share: float = 0.5
    """Multi-turn runs: largest share of a step's trajectories whose `agent/token_drift` is above 0 (the chat
    template's one-shot re-render of the conversation gives other tokens than the trajectory holds) before
    the alarm trips. A share, not a token count: one drifting trajectory counts every position after its
    first difference, so counts grow with the response length. Tiny model, calculator tool, 80 tokens: after
    a short SFT 12-19% of trajectories drift (single-turn ones truncated mid-garbage; no multi-turn one),
    untrained 97-100% (its random tokens do not re-tokenize the same); a template that reformats earlier turns
    makes every multi-turn trajectory drift."""

    no_signal_steps: int = 5
    """Consecutive steps without a learning signal before the no-signal alarm logs a warning and records an
    `alarm` (`quartet.trainer.loop.no_signal_alarm`; step metric `alarm/no_signal`): every prompt group's
    rewards equal (group estimators) or the whole batch's, every advantage 0, or the actor's
    `actor/grad_norm` 0. It says so once, and again only after the signal came back; 0 turns it off."""

    preempt_grace_s: float = 120.0
    """Seconds between SIGTERM (or SLURM's SIGUSR1) reaching the `quartet train` driver and its exit: the
    running step finishes when it fits, its checkpoint is saved, the workers stop, and the process exits
    with `preempt_exit_code`. A second signal, or the grace running out, abandons the save (`latest` stays
    on the previous checkpoint) and exits with the same code at once. Keep it below the scheduler's own
    grace (Kubernetes `terminationGracePeriodSeconds`, SLURM `--signal=B:USR1@N`); 0 turns the handling
    off (the signals act as Python's defaults). docs/reliability.md, "Preemption"."""

    preempt_exit_code: int = 75
    """Exit status of a preempted run (saved, or past its grace): 75 is `EX_TEMPFAIL` of sysexits.h, "try
    again later", the code a requeue rule matches (`trainer.resume=auto` continues the run)."""

    @property
    def run_dir(self) -> Path:
        """`output_dir/project_name/experiment_name`: everything the run writes."""
        return Path(self.output_dir) / self.project_name / self.experiment_name

    def __post_init__(self) -> None:
        require(self.total_epochs > 0, "total_epochs", "must be > 0")
        require(
            self.total_steps >= 0, "total_steps", "must be >= 0", "use 0 to derive steps from total_epochs"
        )
        require(self.test_freq >= 0, "test_freq", "must be >= 0", "use 0 to disable periodic validation")
        require(self.save_freq >= 0, "save_freq", "must be >= 0", "use 0 to save only at the end")
        require(self.max_checkpoints_to_keep >= 0, "max_checkpoints_to_keep", "must be >= 0")
        require(bool(self.resume), "resume", "must not be empty", "use auto, off, or a checkpoint folder")
        require(bool(self.experiment_name), "experiment_name", "must not be empty")
        require(bool(self.project_name), "project_name", "must not be empty")
        require(self.rollout_freq >= 0, "rollout_freq", "must be >= 0", "use 0 to write no rollout records")
        require(self.rollout_samples >= 0, "rollout_samples", "must be >= 0", "use 0 to write every sample")
        require(self.rollout_budget_mb >= 0, "rollout_budget_mb", "must be >= 0")
        require(self.critic_warmup >= 0, "critic_warmup", "must be >= 0", "use 0 to train the actor at once")
        require(self.max_staleness >= 0, "max_staleness", "must be >= 0")
        require(self.async_buffer >= 1, "async_buffer", "must be >= 1")
        require(
            self.split_advice_after_steps >= 0,
            "split_advice_after_steps",
            "must be >= 0",
            "use 0 to print no split advice",
        )
        require(self.preempt_grace_s >= 0, "preempt_grace_s", "must be >= 0", "use 0 to turn preemption off")
        require(
            3 <= self.preempt_exit_code <= 125,
            "preempt_exit_code",
            f"must lie in [3, 125], got {self.preempt_exit_code}",
            "0-2 are done, failed and invalid config, above 125 the shell's; 75 is EX_TEMPFAIL",
        )
        require(self.hang_timeout_s >= 0, "hang_timeout_s", "must be >= 0", "use 0 for the automatic one")
        require(len(set(self.loggers)) == len(self.loggers), "loggers", "lists a logger twice")
        require(
            self.mismatch_alarm_max_abs_diff >= 0,
            "mismatch_alarm_max_abs_diff",
            f"must be >= 0, got {self.mismatch_alarm_max_abs_diff}",
            "use 0 to derive it from the trainer's dtype",
        )
        require(
            0 <= self.mismatch_alarm_max_drift_share <= 1,
            "mismatch_alarm_max_drift_share",
            f"must lie in [0, 1], got {self.mismatch_alarm_max_drift_share}",
            "use 0 to trip on any drift, 1 never to trip on drift",
        )
        require(
            self.no_signal_steps >= 0,
            "no_signal_steps",
            f"must be >= 0, got {self.no_signal_steps}",
            "use 0 to turn the no-signal alarm off",
        )
