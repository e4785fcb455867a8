"""`data.reasoning_gym`: a reasoning-gym mixture as a run's prompts from the config alone (issue 52),
and the per-source training reward it logs (`reward/<data_source>/mean`)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

reasoning_gym = pytest.importorskip(
    "reasoning_gym", reason="the environments extra is not installed: make install"
)

from quartet.config import ConfigError, load_config  # noqa: E402
from quartet.environments.reasoning_gym import GymTask, rows  # noqa: E402
from quartet.environments.reasoning_gym_files import (  # noqa: E402
    VAL_SEED_OFFSET,
    sft_rows,
    write_config_sets,
)

MIXTURE = (
    "data.reasoning_gym.tasks=[{name: chain_sum, config: {min_terms: 2, max_terms: 2, max_digits: 1}}, "
    "{name: gcd, config: {max_value: 30}, weight: 2, seed: 7}]"
)


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _question(row: dict) -> str:
    return str(row["prompt"][-1]["content"])


def test_the_section_writes_the_same_rows_each_time_and_holds_training_out(tmp_path: Path) -> None:
    sizes = ["data.builtin_train_size=40", "data.builtin_val_size=10", "data.seed=3"]
    cfg = load_config(None, [MIXTURE, *sizes])
    train, val = write_config_sets(cfg.data, tmp_path / "a")
    again = write_config_sets(cfg.data, tmp_path / "b")
    assert train.relative_to(tmp_path / "a") == Path("reasoning_gym/rl_train.parquet")
    assert _rows(train) == _rows(again[0]) and _rows(val) == _rows(again[1])  # a resume reads the same rows
    # the same rows built straight from the module's GymTasks: chain_sum takes data.seed, gcd its own seed
    chain = GymTask("chain_sum", {"min_terms": 2, "max_terms": 2, "max_digits": 1}, seed=3, size=40)
    gcd = GymTask("gcd", {"max_value": 30}, seed=7, size=40, weight=2.0)
    assert _rows(train) == rows([chain, gcd], 40, seed=3)
    held_out = _rows(val)
    assert len(held_out) == 10
    assert not {_question(r) for r in held_out} & {_question(r) for r in _rows(train)}
    assert {r["extra_info"]["seed"] for r in held_out} <= {3 + VAL_SEED_OFFSET, 7 + VAL_SEED_OFFSET}
    assert {r["data_source"] for r in _rows(train)} == {"reasoning_gym/chain_sum", "reasoning_gym/gcd"}


def test_system_prompt_none_and_literal_text(tmp_path: Path) -> None:
    base = [MIXTURE, "data.builtin_train_size=4", "data.builtin_val_size=2"]
    none = load_config(None, [*base, "data.reasoning_gym.system_prompt=none"])
    prompt = _rows(write_config_sets(none.data, tmp_path / "n")[0])[0]["prompt"]
    assert [m["role"] for m in prompt] == ["user"]
    text = load_config(None, [*base, "data.reasoning_gym.system_prompt=Reply with <answer>N</answer>."])
    first = _rows(write_config_sets(text.data, tmp_path / "t")[0])[0]["prompt"][0]
    assert first == {"role": "system", "content": "Reply with <answer>N</answer>."}


def test_an_unknown_task_is_named_with_close_names(tmp_path: Path) -> None:
    cfg = load_config(None, ["data.reasoning_gym.tasks=[{name: gcd}, {name: chain_sums}]"])
    with pytest.raises(ConfigError) as info:
        write_config_sets(cfg.data, tmp_path)
    assert info.value.field == "data.reasoning_gym.tasks[1].name"
    assert "chain_sums" in str(info.value) and "chain_sum" in info.value.fix
    assert not (tmp_path / "reasoning_gym").exists()  # nothing written before the check


def test_settings_the_dataset_refuses_are_named(tmp_path: Path) -> None:
    cfg = load_config(None, ["data.reasoning_gym.tasks=[{name: gcd, config: {max_value: 0}}]"])
    with pytest.raises(ConfigError) as info:
        write_config_sets(cfg.data, tmp_path)
    assert info.value.field == "data.reasoning_gym.tasks[0].config" and "gcd" in str(info.value)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("data.reasoning_gym.tasks=[{config: {}}]", "data.reasoning_gym.tasks[0].name"),
        ("data.reasoning_gym.tasks=[{name: gcd, weight: 0}]", "data.reasoning_gym.tasks[0].weight"),
        ("data.reasoning_gym.tasks=[{name: gcd, config: [1]}]", "data.reasoning_gym.tasks[0].config"),
        ("data.reasoning_gym.tasks=[{name: gcd}, {name: gcd}]", "data.reasoning_gym.tasks"),
        ("data.train_files=[x.parquet]", "data.reasoning_gym.tasks"),
    ],
)
def test_bad_sections_are_refused_naming_the_field(override: str, field: str) -> None:
    extra = ["data.reasoning_gym.tasks=[{name: gcd}]"] if override.startswith("data.train_files") else []
    with pytest.raises(ConfigError) as info:
        load_config(None, [*extra, override])
    assert info.value.field == field


def test_too_few_fresh_validation_problems_names_the_size(tmp_path: Path) -> None:
    # one-digit chain sums of 2 terms: 100 problems at most, so 80 fresh held-out ones cannot exist
    one_digit = "{min_terms: 2, max_terms: 2, max_digits: 1}"
    small = f"data.reasoning_gym.tasks=[{{name: chain_sum, config: {one_digit}}}]"
    cfg = load_config(None, [small, "data.builtin_train_size=400", "data.builtin_val_size=80"])
    with pytest.raises(ConfigError) as info:
        write_config_sets(cfg.data, tmp_path)
    assert info.value.field == "data.builtin_val_size"


def test_worked_examples_answer_in_reasoning_gyms_format() -> None:
    task = GymTask("gcd", {"max_value": 30}, seed=1, size=20)
    rl = rows([task], 5, system_prompt=None)
    dataset = reasoning_gym.create_dataset("gcd", seed=1, size=20, max_value=30)
    for row, example in zip(rl, sft_rows(rl), strict=True):
        assert example["messages"][:-1] == row["prompt"]
        answer = reasoning_gym.utils.extract_answer(example["messages"][-1]["content"])
        assert dataset.score_answer(answer, dataset[row["extra_info"]["index"]]) == 1.0


@pytest.mark.usefixtures("one_local_rank")
def test_quartet_train_runs_grpo_on_a_two_task_mixture_from_the_config(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from quartet.trainer.loop.rl_trainer import RLTrainer

    cfg = load_config(
        None,
        [
            MIXTURE,
            "data.reasoning_gym.system_prompt=none",
            "cluster.backend=local",
            f"model.path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "data.builtin_train_size=16",
            "data.builtin_val_size=4",
            "data.train_batch_size=4",
            "data.max_prompt_length=96",
            "data.max_response_length=8",
            "rollout.n=2",
            "actor.mini_batch_size=4",
            "actor.micro_batch_size_per_device=8",
            "actor.mixed_precision=float32",
            "trainer.total_steps=2",
            "trainer.test_freq=0",
            "trainer.rollout_freq=1",
            "trainer.rollout_samples=0",
            "trainer.rollout_tokens=false",
            "trainer.export_final=false",
        ],
    )
    result = RLTrainer(cfg).run()
    written = write_config_sets(cfg.data, tmp_path / "again")[0]
    assert _rows(result.run_dir / "data" / "reasoning_gym" / "rl_train.parquet") == _rows(written)
    steps = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    for rec in steps:
        samples = [json.loads(x) for x in (result.run_dir / f"rollouts/step_{rec['step']}.jsonl").open()]
        assert len(samples) == 8  # every sample: 4 prompts x 2
        by_source: dict[str, list[float]] = {}
        for s in samples:
            by_source.setdefault(s["data_source"], []).append(s["score"])
        logged = {k: v for k, v in rec.items() if k.startswith("reward/reasoning_gym/")}
        expected = {f"reward/{k}/mean": sum(v) / len(v) for k, v in by_source.items()}
        assert set(logged) == set(expected) and logged == pytest.approx(expected)


def test_source_score_metrics_average_each_sources_sequence_scores() -> None:
    import torch

    from quartet.core.metrics import source_score_metrics

    scores = torch.zeros(4, 3)
    for (row, col), value in {(0, 1): 1.0, (1, 2): 0.5, (2, 0): 0.25, (3, 2): 9.0}.items():
        scores[row, col] = value  # row 3's score sits in padding: not counted
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    metrics = source_score_metrics(scores, mask, ["a", "b", "a", "b"])
    assert metrics == pytest.approx({"reward/a/mean": (1.0 + 0.25) / 2, "reward/b/mean": (0.5 + 0.0) / 2})
    with pytest.raises(ValueError, match="3 data sources for 4 rows"):
        source_score_metrics(scores, mask, ["a", "b", "a"])


def test_the_built_in_tasks_resolver_refuses_a_mixture_instead_of_writing_arithmetic(tmp_path: Path) -> None:
    from quartet.tasks import resolve_data_files

    cfg = load_config(None, ["data.reasoning_gym.tasks=[{name: gcd}]"])
    with pytest.raises(ValueError, match="write_config_sets"):
        resolve_data_files(cfg.data, tmp_path)
    assert not any(tmp_path.iterdir())
