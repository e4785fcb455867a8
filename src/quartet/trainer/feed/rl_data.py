"""The prompts of an RL run: the configured files, or the built-in task written into the run folder, loaded
with the checks that refuse (or skip and name) a bad row at load instead of mid-run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quartet.config import QuartetConfig
from quartet.core.batch import Batch
from quartet.data.images import ImageInputs
from quartet.data.prompts import PromptDataset
from quartet.tracking.run_layout import DATA_DIR

__all__ = ["RLData", "image_inputs", "prepare_rl_data", "prompt_batch", "source_checker"]


@dataclass
class RLData:
    """The run's prompts: training set, validation set (may be None) and where they came from."""

    train: PromptDataset
    val: PromptDataset | None


def image_inputs(cfg: QuartetConfig, model_path: str, tokenizer: Any) -> ImageInputs | None:
    """The image processor and image token of a vision-language model (prompts may hold images), with
    `data.min_pixels` / `data.max_pixels` applied; None for a text-only model."""
    from quartet.models.loading import is_vision_model, load_image_processor

    if not is_vision_model(model_path):
        return None
    _check_agent_images(cfg, model_path)
    processor = load_image_processor(model_path, cfg.data.min_pixels, cfg.data.max_pixels)
    return ImageInputs.of(processor, tokenizer, cfg.data.image_key)


def _check_agent_images(cfg: QuartetConfig, model_path: str) -> None:
    """Refuse the agent-loop settings that do not carry a vision-language model's images (docs/vision.md,
    "Image tool turns"): the vLLM engine's token path, and re-rendered histories."""
    from quartet.config.rollout import RolloutEngineKind, TemplateMode
    from quartet.data.errors import DataError

    mt = cfg.rollout.multi_turn
    if not mt.enable:
        return
    if cfg.rollout.engine is not RolloutEngineKind.TORCH:
        raise DataError(
            model_path,
            f"rollout.multi_turn with a vision-language model needs the built-in engine: the agent loops' "
            f"image turns do not reach rollout.engine: {cfg.rollout.engine.value} (docs/vision.md)",
            fix="set rollout.engine: torch, or rollout.multi_turn.enable: false to train single-turn",
        )
    if mt.template_mode is TemplateMode.RERENDER:
        raise DataError(
            model_path,
            "rollout.multi_turn.template_mode: rerender does not carry images (a re-rendered history would "
            "re-expand every image each turn)",
            fix="set rollout.multi_turn.template_mode: keep_history_tokens (or strict)",
        )


def prepare_rl_data(
    cfg: QuartetConfig,
    tokenizer: Any,
    run_dir: Path,
    images: ImageInputs | None = None,
    rules_score: bool = True,
) -> RLData:
    """Train/val prompt datasets from the configured files, or the reasoning-gym mixture
    (`data.reasoning_gym`) or the built-in task written to `run_dir/data`;
    `images` (`image_inputs`) when the model reads images. rules_score: False when reward functions passed
    as callables score (no row needs a rule scorer)."""
    train_files, val_files = list(cfg.data.train_files), list(cfg.data.val_files)
    if not train_files and cfg.data.reasoning_gym.tasks:
        from quartet.environments.reasoning_gym_files import write_config_sets

        train_path, val_path = write_config_sets(cfg.data, run_dir / DATA_DIR)
        train_files, val_files = [str(train_path)], val_files or [str(val_path)]
    elif not train_files:
        from quartet.config.data import BuiltinTask
        from quartet.tasks import ArithmeticSpec, builtin_spec, write_builtin

        spec: Any = builtin_spec(cfg.data.builtin_task, cfg.data.builtin_digits)
        if cfg.data.builtin_task is BuiltinTask.ARITHMETIC:
            ops = tuple(op.symbol for op in cfg.data.builtin_operations)
            spec = ArithmeticSpec(digits=cfg.data.builtin_digits, operations=ops)
        train_path, val_path = write_builtin(
            cfg.data.builtin_task,
            run_dir / DATA_DIR,
            cfg.data.builtin_train_size,
            cfg.data.builtin_val_size,
            cfg.data.seed,
            spec=spec,
        )
        train_files, val_files = [str(train_path)], val_files or [str(val_path)]
    tools, check = _tool_schemas(cfg), source_checker(cfg) if rules_score else None
    train = PromptDataset.from_files(train_files, cfg.data, tokenizer, tools, check, images)
    val = (
        PromptDataset.from_files(val_files, cfg.data, tokenizer, tools, check, images) if val_files else None
    )
    return RLData(train, val)


def source_checker(cfg: QuartetConfig) -> Callable[[str], None] | None:
    """When the built-in rules score (no `reward.function`, reward model or judge), a check that a data source
    has a rule scorer, raising `RowProblem`: run on every row at load, so a row no rule knows is refused
    (or skipped) there, naming its file and row, instead of crashing the run when it is first drawn."""
    if cfg.reward.function or cfg.reward.model_path or cfg.reward.judge.enabled:
        return None
    from quartet.data.errors import RowProblem
    from quartet.rewards.rules.registry import UnknownDataSourceError, known_data_sources, select_scorer

    key = cfg.data.data_source_key

    def check(data_source: str) -> None:
        try:
            select_scorer(data_source)
        except UnknownDataSourceError:
            raise RowProblem(
                "unknown_data_source",
                key,
                f"no rule scorer for data_source {data_source!r}; known data sources: {known_data_sources()}",
                "correct the row's data_source, or set reward.function=path/to/file.py:function_name (a "
                "compute_score(data_source, solution_str, ground_truth, extra_info) that scores it)",
            ) from None

    return check


def _tool_schemas(cfg: QuartetConfig) -> list[dict[str, Any]] | None:
    """The schemas the agent loops render into prompts (multi-turn runs), so prompt lengths are measured as
    the model sees them; loading the tools here also reports a bad tools file before any worker starts."""
    if not cfg.rollout.multi_turn.enable:
        return None
    from quartet.agents.runner import build_tools

    return [tool.schema for tool in build_tools(cfg.rollout.multi_turn).values()] or None


def prompt_batch(dataset: PromptDataset, indices: list[int], step: int, draw: int = 0) -> Batch:
    """The step's prompt batch with a fresh `uid` per prompt (the group id of its n responses); `draw` > 0
    for dynamic sampling's extra draws of the same step."""
    batch = dataset.batch(indices)
    uids = [f"s{step}-d{draw}-p{i}" for i in range(len(indices))]
    uids_batch = Batch({}, {"uid": uids}, batch_size=len(indices))
    return batch.union(uids_batch).with_meta(global_step=step)
