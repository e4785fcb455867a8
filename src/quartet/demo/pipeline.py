"""The demo: what RL adds when worked examples are scarce and verifiable prompts are not.

    result = run_demo(overrides=[], seed=0, quick=False, on_record=print)

1. **SFT start.** A tiny Qwen2 (built by the code) learns the answer format and some addition from a small
   fixed set of worked examples (`sft.builtin.train_size`, a few hundred).
2. **GRPO.** From the SFT start, `quartet train`'s trainer draws fresh problems each step, samples
   `rollout.n` answers per problem and reinforces those the exact verifier accepts.
3. **Control.** From the SFT start again, more SFT over the same small example set for the same training
   wall time GRPO took (`sft.max_seconds`): what the extra compute buys without RL.

All three models are scored the same way: greedy answers to the same held-out problems (never in either
training set), checked by the verifier. GRPO should beat both rows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from quartet.config import QuartetConfig, load_config
from quartet.config.trainer import Logger
from quartet.demo.reasoning_gym import gym_name, gym_overrides, with_worked_examples
from quartet.demo.vision import QUICK_OVERRIDES as VISION_QUICK
from quartet.demo.vision import VisionSettings, split_settings
from quartet.demo.vision import with_section as _with
from quartet.tasks.rows import RL_FILES
from quartet.tracking.run_layout import DATA_DIR

__all__ = [
    "DEMOS",
    "DEVICES",
    "FILTERED_ROW",
    "GPU",
    "MODELS",
    "MOE",
    "NO_FILTERED_VISION",
    "DemoResult",
    "DemoRow",
    "cuda_problem",
    "demo_config",
    "greedy_accuracy",
    "model_problem",
    "run_demo",
]

log = logging.getLogger(__name__)
Record = dict[str, Any]

QUICK = {
    "arithmetic": [
        "sft.epochs=40",
        "trainer.total_steps=20",
        "trainer.test_freq=0",
        "data.builtin_train_size=2000",
    ],
    "calculator": [
        "sft.epochs=8",
        "trainer.total_steps=4",
        "trainer.test_freq=0",
        "data.builtin_train_size=500",
        "data.builtin_val_size=50",
        "data.val_batch_size=50",
        "sft.builtin.val_size=50",
    ],
    "vision": VISION_QUICK,
}
"""`--quick`: a smoke of the whole pipeline in a minute or two per task (the margins are not meaningful)."""

DEVICES = ("cpu", "gpu")
"""`quartet demo --device D`: where the demo trains (cpu: the embedded configs as they are)."""

GPU = {
    "arithmetic": [
        "cluster.device=gpu",
        "cluster.cpus_per_bundle=4",
        # a ~0.1B Qwen2 shape (GPT-2 small's width and depth) with the tokenizer trained here: no download
        "model.tiny={hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, "
        "num_key_value_heads: 4, intermediate_size: 3072}",
        "rollout.dtype=bfloat16",
        "rollout.max_num_seqs=256",
        "actor.mixed_precision=bfloat16",
        "actor.optim.lr=3.0e-5",  # Adam's step is ~lr per weight: ~1/6 of the CPU model's for 6x the width
        "actor.micro_batch_size_per_device=256",
        "trainer.total_steps=50",
        "trainer.test_freq=25",
        "sft.mixed_precision=bfloat16",
        "sft.optim={lr: 2.0e-4, warmup_steps: 50}",
        "sft.epochs=100",
        "sft.max_seconds=45",  # the SFT start stops at 100 epochs or 45 s of training, whichever first
    ],
}
"""`--device gpu`: the arithmetic demo at a GPU size that should finish on one H100 in under 5 minutes.
Estimated from the GPU kit's H200 figures (not yet run on a GPU): three stage starts of ~30 s (workers,
model build), SFT start 45 s, GRPO ~50 s (50 steps of 256 samples of <= 8 tokens: ~1 s each), the
control as long, the evaluation and the imports ~30 s: about 4.5 minutes."""


MODELS = ("dense", "moe")
"""`quartet demo --model M`: the tiny model the demo trains (dense: the embedded configs' Qwen2)."""

MOE = {
    "arithmetic": [
        # examples/moe/config.yaml's tiny Qwen3-MoE: 1,054,080 parameters active per token (the dense demo
        # model has 1,050,752 in all) of 3,413,376; tests/cli/test_demo_moe.py holds the two equal
        "model.tiny={arch: qwen3_moe, hidden_size: 128, num_hidden_layers: 4, num_attention_heads: 4, "
        "num_key_value_heads: 2, num_experts: 8, num_experts_per_tok: 2, moe_intermediate_size: 256, "
        "intermediate_size: 128}",
        "actor.moe_aux_loss_coef=0.01",
        "actor.moe_z_loss_coef=0.001",
        "trainer.experiment_name=demo-moe",  # its own run folders: a dense run's models stay
    ],
}
"""`--model moe`: the tiny Qwen3-MoE of examples/moe with its router loss coefficients, on the tasks whose
demo is sized for it (arithmetic). The rest of the demo (data, GRPO, the control, the scoring) is as dense."""


def model_problem(task: str, model: str, device: str = "cpu") -> str | None:
    """Why `--model` cannot run with this `--task` and `--device`, naming the flags and the fix; None when
    it can."""
    if model not in MODELS:
        return f"unknown demo model {model!r}; the models are {', '.join(MODELS)}"
    if model == "dense":
        return None
    if task not in MOE:
        return (
            f"--model {model} runs the {', '.join(MOE)} demo; --task {task} has a dense model only. "
            f"Fix: drop --model {model}, or use --task {' / '.join(MOE)}"
        )
    if device != "cpu":
        return (
            f"--model {model} runs on CPU; --device {device} has a dense model only. "
            f"Fix: drop --device {device}"
        )
    return None


def cuda_problem() -> str | None:
    """Why `--device gpu` cannot run here, with the fix; None when torch sees a CUDA device."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return (
        f"--device gpu needs a CUDA device, but torch {torch.__version__} ({build}) sees none. "
        "Fix: run `quartet demo` without --device gpu (the CPU demo), or run it on a machine with an NVIDIA "
        "GPU and a CUDA build of torch (`nvidia-smi` lists the GPUs; CUDA_VISIBLE_DEVICES must not hide them)"
    )


@dataclass
class DemoRow:
    """One row of the table."""

    name: str
    accuracy: float
    correct: int
    total: int
    train_seconds: float
    model_dir: str


@dataclass
class DemoResult:
    """The table and where the run's files are."""

    rows: list[DemoRow] = field(default_factory=list)
    run_dir: Path = Path(".")
    seconds: float = 0.0
    plot: Path | None = None
    """GRPO's curves (`quartet plot`), when matplotlib is installed."""
    grpo_run: Path | None = None
    """GRPO's run folder: its rollouts, token by token, open with `quartet inspect`."""


FILTERED_ROW = "verified SFT (control)"
"""The row of `run_demo(filtered_control=True)`: more SFT on the traces the verifier accepts only."""

DEMOS = {"arithmetic": "demo.yaml", "calculator": "calculator.yaml", "vision": "vision.yaml"}
"""`quartet demo --task T`: the embedded config of each demo (single-turn addition; multi-turn tool use;
counting shapes in pictures, whose SFT side is `quartet.demo.vision.VisionSettings`)."""

NO_FILTERED_GYM = (
    "--filtered-control has no meaning for --task reasoning_gym:<name>: every worked example's answer is the "
    "task's own, so the verified traces are all of them. Fix: drop --filtered-control"
)

NO_FILTERED_VISION = (
    "--filtered-control has no meaning for --task vision: every worked answer of its chat set is right, so "
    "the verified traces are all of them and the row would repeat the control. Fix: drop --filtered-control"
)


def demo_config(
    overrides: list[str],
    seed: int,
    quick: bool,
    task: str = "arithmetic",
    device: str = "cpu",
    model: str = "dense",
) -> QuartetConfig:
    """The embedded demo config with the `device`'s sizes (`GPU`) or the `model`'s (`MOE`), the seed applied
    everywhere, `--quick` settings, then the user's. Builds the config only: nothing checks that the device
    is there. For `task="vision"` the `vision.<name>=<value>` overrides are the SFT side's
    (`split_settings`), checked here and left out of the config."""
    gym = gym_name(task)
    if task not in DEMOS and gym is None:
        known = f"{', '.join(DEMOS)}, reasoning_gym:<name>"
        raise ValueError(f"unknown demo task {task!r}; the demos are {known}")
    if device not in DEVICES:
        raise ValueError(f"unknown demo device {device!r}; the devices are {', '.join(DEVICES)}")
    if device == "gpu" and task not in GPU:
        raise ValueError(f"--device gpu runs the {', '.join(GPU)} demo; --task {task} is on CPU only")
    if problem := model_problem(task, model, device):
        raise ValueError(problem)
    if task == "vision":
        overrides = split_settings(overrides, quick)[1]
    path = resources.files("quartet.demo") / DEMOS["arithmetic" if gym else task]
    sized = GPU[task] if device == "gpu" else MOE[task] if model == "moe" else []
    sized = gym_overrides(gym, quick) if gym else sized
    seeds = [f"trainer.seed={seed}", f"data.seed={seed}", f"sft.seed={seed}", f"model.tiny.seed={seed}"]
    seeds += [f"rollout.seed={seed}"]
    with resources.as_file(path) as file:
        quick_sizes = QUICK[task] if quick and not gym else []
        return load_config(str(file), [*sized, *seeds, *quick_sizes, *overrides])


def greedy_accuracy(cfg: QuartetConfig, model_dir: str, val_file: str) -> tuple[int, int]:
    """(correct, total) greedy answers of the model in `model_dir` to the prompts of `val_file`.

    With `rollout.multi_turn.enable` each answer is a whole greedy agent-loop conversation (tools and
    simulated users as in training), scored on what the loop hands the reward function.
    """
    from quartet.data.prompts import PromptDataset
    from quartet.environments.reasoning_gym import DATA_SOURCE_PREFIX
    from quartet.environments.reasoning_gym import compute_score as gym_score
    from quartet.models.loading import load_tokenizer
    from quartet.rollout import SamplingParams, TorchRolloutEngine, requests_from_batch
    from quartet.tasks import task_scorer

    tokenizer = load_tokenizer(model_dir)
    mt = cfg.rollout.multi_turn
    params = SamplingParams(temperature=0.0, max_new_tokens=cfg.data.max_response_length)
    with TorchRolloutEngine.from_pretrained(model_dir, max_num_seqs=cfg.rollout.max_num_seqs) as engine:
        if mt.enable:
            texts, extras, batch = _agent_answers(cfg, engine, tokenizer, val_file, params)
        else:
            data = PromptDataset.from_files([val_file], cfg.data, tokenizer)
            batch = data.batch(list(range(len(data))))
            outputs = engine.generate(requests_from_batch(batch, params))
            texts = [
                str(tokenizer.decode(list(outs[0].token_ids), skip_special_tokens=True)) for outs in outputs
            ]
            extras = [None] * len(texts)
    correct = 0
    for i, text in enumerate(texts):
        source = batch.non_tensors["data_source"][i]
        if source.startswith(DATA_SOURCE_PREFIX):  # right: reasoning-gym's own score is 1
            info = batch.non_tensors["extra_info"][i]
            correct += int(gym_score(source, text, batch.non_tensors["ground_truth"][i], info) == 1.0)
            continue
        scorer = task_scorer(source)
        if scorer is None:
            raise ValueError(f"the demo scores built-in tasks only; '{source}' has no built-in scorer")
        correct += int(scorer(text, batch.non_tensors["ground_truth"][i], extras[i]) >= 1.0)
    return correct, len(texts)


def _agent_answers(
    cfg: QuartetConfig, engine: Any, tokenizer: Any, val_file: str, params: Any
) -> tuple[list[str], list[Any], Any]:
    """Greedy agent-loop conversations over `val_file`: (response texts, extra_info, the rollout batch)."""
    from quartet.agents.runner import AgentRunner
    from quartet.data.prompts import PromptDataset
    from quartet.rewards.compute import RewardComputer
    from quartet.serving import OpenAIServer

    runner = AgentRunner.from_config(cfg.rollout.multi_turn, tokenizer, cfg.data.max_response_length)
    schemas = [tool.schema for tool in runner.env.tools.values()]
    data = PromptDataset.from_files([val_file], cfg.data, tokenizer, tools=schemas)
    server = OpenAIServer(engine, tokenizer, "policy")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    try:
        batch = runner.run(data.batch(list(range(len(data)))), params, server.generate_tokens, int(pad))
    finally:
        asyncio.run(server.stop())
    lengths = RewardComputer.response_lengths(batch).tolist()
    rows = [ids[:n].tolist() for ids, n in zip(batch["responses"], lengths, strict=True)]
    texts = list(tokenizer.batch_decode(rows, skip_special_tokens=True))
    return texts, list(batch.non_tensors["extra_info"]), batch


def run_demo(
    overrides: list[str],
    seed: int = 0,
    quick: bool = False,
    on_record: Callable[[Record], None] | None = None,
    task: str = "arithmetic",
    filtered_control: bool = False,
    device: str = "cpu",
    model: str = "dense",
) -> DemoResult:
    """SFT start, GRPO from it, and the time-matched more-SFT control; the accuracy table.

    `filtered_control` adds a fourth row: more SFT from the same start, for the same time, on the traces the
    verifier accepts only (`sft.keep_verified`: rejection-sampled demonstrations), the control a reviewer
    asks for when the traces are of mixed quality. `device="gpu"` runs the GPU sizes (`GPU`); it fails at
    once (RuntimeError, with the fix) where torch sees no CUDA device. `task="vision"` runs the same three
    rows on pictures (`quartet.demo.vision`); it has no filtered control (ValueError). `model="moe"` trains
    the tiny Qwen3-MoE of `MOE` instead (arithmetic on CPU only: ValueError otherwise, naming the flags).
    """
    start = time.perf_counter()
    if task == "vision" and filtered_control:
        raise ValueError(NO_FILTERED_VISION)
    if gym_name(task) and filtered_control:
        raise ValueError(NO_FILTERED_GYM)
    cfg = demo_config(overrides, seed, quick, task, device, model)
    problem = cuda_problem() if device == "gpu" else None
    if problem:
        raise RuntimeError(problem)
    # a --quick run has its own folder: it must not replace the models and table of a full run
    project = f"{cfg.trainer.experiment_name}{'-quick' if quick else ''}-seed{seed}"
    base = Path(cfg.trainer.output_dir) / project  # each stage's run folder is base/<stage>
    if gym_name(task):
        cfg = with_worked_examples(cfg, base / "worked_examples")
    result = DemoResult(run_dir=base)
    emit = on_record or (lambda rec: None)
    if task == "vision":
        scored, rl_run_dir = _vision_models(cfg, split_settings(overrides, quick)[0], project, emit)
    else:
        scored, rl_run_dir = _text_models(cfg, project, emit, filtered_control)
    for name, model_dir, seconds, correct, total in scored:
        row = DemoRow(name, correct / total, correct, total, seconds, model_dir)
        result.rows.append(row)
        emit({"kind": "demo_row", **dataclasses.asdict(row)})
    result.plot = _plot(rl_run_dir)
    result.grpo_run = rl_run_dir
    result.seconds = time.perf_counter() - start
    return result


Scored = list[tuple[str, str, float, int, int]]
"""(row name, model folder, training seconds, correct, total) per model of the table."""


def _text_models(
    cfg: QuartetConfig, project: str, emit: Callable[[Record], None], filtered_control: bool
) -> tuple[Scored, Path]:
    """The text demo's models, each scored on the GRPO run's held-out problems (`greedy_accuracy`)."""
    models, rl_run_dir = _train_models(cfg, project, emit, filtered_control)
    folder = "reasoning_gym" if cfg.data.reasoning_gym.tasks else cfg.data.builtin_task.value
    val_file = str(rl_run_dir / DATA_DIR / folder / RL_FILES[1])
    scored = [(name, d, secs, *greedy_accuracy(cfg, d, val_file)) for name, d, secs in models]
    return scored, rl_run_dir


def _vision_models(
    cfg: QuartetConfig, settings: VisionSettings, project: str, emit: Callable[[Record], None]
) -> tuple[Scored, Path]:
    """The vision demo's models (`quartet.demo.vision.run_vision`), scored on its held-out pictures."""
    from quartet.demo.vision import run_vision

    models, rl_run_dir = run_vision(cfg, settings, project, emit)
    return [(m.name, str(m.model_dir), m.train_seconds, m.correct, m.total) for m in models], rl_run_dir


def _train_models(
    cfg: QuartetConfig, project: str, emit: Callable[[Record], None], filtered_control: bool
) -> tuple[list[tuple[str, str, float]], Path]:
    """Train the demo's models in turn: the SFT start, GRPO from it, the more-SFT control for GRPO's
    training time (and the filtered control). Returns (row name, model folder, training seconds) per
    model, and the GRPO run folder (it holds the validation file and the curves)."""
    from quartet.sft import SFTTrainer
    from quartet.trainer import RLTrainer

    # the demo prints its own progress (on_record): the console logger would say everything twice
    loggers = tuple(x for x in cfg.trainer.loggers if x is not Logger.CONSOLE)

    def stage(name: str) -> QuartetConfig:
        return _with(cfg, "trainer", project_name=project, experiment_name=name, loggers=loggers)

    sft_start = SFTTrainer(stage("sft_start"), on_record=emit).run()
    sft_dir = str(sft_start.hf_dir)
    rl = RLTrainer(_with(stage("grpo"), "model", path=sft_dir), on_record=emit).run()
    control_cfg = _with(
        _with(stage("sft_control"), "model", path=sft_dir),
        "sft",
        max_seconds=rl.train_seconds,
        epochs=100_000,
    )
    control = SFTTrainer(control_cfg, on_record=emit).run()
    models = [
        ("SFT start", sft_dir, sft_start.train_seconds),
        ("GRPO", str(rl.hf_dir), rl.train_seconds),
        ("more SFT (control)", str(control.hf_dir), control.train_seconds),
    ]
    if filtered_control:
        filtered_cfg = _with(
            _with(control_cfg, "trainer", experiment_name="sft_filtered"), "sft", keep_verified=True
        )
        filtered = SFTTrainer(filtered_cfg, on_record=emit).run()
        models.append((FILTERED_ROW, str(filtered.hf_dir), filtered.train_seconds))
    return models, rl.run_dir


def _plot(run_dir: Path) -> Path | None:
    """`quartet plot` of the GRPO run; None (with a log line) when matplotlib is missing."""
    from quartet.tracking import TrackerUnavailableError
    from quartet.tracking.plot import plot_run

    try:
        return plot_run(run_dir)
    except TrackerUnavailableError as err:
        log.warning("no plot: %s", err)
        return None
