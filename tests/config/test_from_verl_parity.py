"""`from_verl` where verl's own checks decide: micro-batches per data-parallel group, and notes that apply.

verl's FSDP engine takes its data-parallel size as world / ulysses_sp (`get_data_parallel_size`), asserts
that the mini-batch's responses split over it, and cuts each data-parallel rank's rows into micro-batches of
`ppo_micro_batch_size_per_gpu`; its deprecated global micro-batch is divided by that size. `verl_accepts`
below is that rule, written from verl 0.9.1's engine worker; quartet's sequence groups pool their rows the
same way (docs/parallelism.md, "Micro-batching with SP").
"""

from __future__ import annotations

import pytest

from quartet.config import ConfigError, load_config
from quartet.config.from_verl import FromVerlError, translate_overrides
from quartet.config.verl_keys import RULES

AR = "actor_rollout_ref"


def verl_accepts(prompts: int, n: int, world: int, sp: int, micro: int) -> bool:
    """verl's check of one mini-batch: its responses split over dp = world / sp ranks, and each rank's
    rows split into micro-batches of `micro`."""
    dp = world // sp
    responses = prompts * n
    return responses % dp == 0 and (responses // dp) % micro == 0


def _sp_run(sp: int, micro: int, *extra: str) -> list[str]:
    return [
        "algorithm.adv_estimator=grpo",
        f"{AR}.model.path=/models/m",
        "data.train_batch_size=64",
        f"{AR}.actor.ppo_mini_batch_size=16",
        f"{AR}.rollout.n=5",
        f"{AR}.actor.ulysses_sequence_parallel_size={sp}",
        f"{AR}.actor.ppo_micro_batch_size_per_gpu={micro}",
        "trainer.n_gpus_per_node=8",
        *extra,
    ]


def test_sp_micro_batch_that_verl_accepts_validates() -> None:
    # 16 prompts x 5 = 80 responses per mini-batch; sp 2 over 8 GPUs: dp 4, 20 rows per group, 10 per GPU.
    # A micro-batch of 4 divides the group's 20 (verl accepts) but not a GPU's 10 (the old check refused).
    assert verl_accepts(16, 5, 8, 2, 4) and (80 // 8) % 4 != 0
    cfg = translate_overrides(_sp_run(2, 4)).build()
    assert (cfg.model.sequence_parallel_size, cfg.actor.micro_batch_size_per_device) == (2, 4)


def test_sp_micro_batch_that_verl_refuses_is_named_with_the_group() -> None:
    assert not verl_accepts(16, 5, 8, 2, 8)  # 20 rows per group, micro-batches of 8
    with pytest.raises(FromVerlError) as caught:
        translate_overrides(_sp_run(2, 8)).build()
    text = str(caught.value)
    assert "8 responses does not divide the 20 responses each data-parallel group gets" in text
    assert "dp 4; dp = 8 devices / (sp 2 x tp 1)" in text
    assert f"translated from: {AR}.actor.ppo_micro_batch_size_per_gpu=8" in text
    assert "one of [1, 2, 4, 5, 10, 20]" in text


def test_without_sp_the_micro_batch_still_divides_each_device() -> None:
    assert not verl_accepts(16, 5, 8, 1, 4)  # dp 8: 10 rows per GPU
    with pytest.raises(FromVerlError, match="4 responses does not divide the 10 responses each device gets"):
        translate_overrides(_sp_run(1, 4)).build()


def test_quartet_config_check_counts_the_group_for_tp_too() -> None:
    base = [
        "model.path=/models/m",
        "cluster.bundles_per_node=8",
        "data.train_batch_size=64",
        "actor.mini_batch_size=16",
        "rollout.n=5",
        "actor.micro_batch_size_per_device=4",
    ]
    tp2 = load_config(overrides=[*base, "model.tensor_parallel_size=2"])
    assert tp2.actor.micro_batch_size_per_device == 4  # tp 2: dp 4, 20 rows per tensor group
    with pytest.raises(ConfigError, match="does not divide the 10 responses each device gets"):
        load_config(overrides=base)


@pytest.mark.parametrize(
    ("sp", "value", "expected"),
    [(1, 128, 16), (2, 128, 32), (2, 100, 25), (4, 8, 4)],  # dp = 8 / sp
)
def test_global_micro_batch_is_divided_by_the_data_parallel_size(sp: int, value: int, expected: int) -> None:
    t = translate_overrides(
        [f"{AR}.actor.ulysses_sequence_parallel_size={sp}", f"{AR}.actor.ppo_micro_batch_size={value}"]
    )
    assert t.quartet_values["actor.micro_batch_size_per_device"] == expected


def test_global_micro_batch_names_the_data_parallel_size_when_it_does_not_split() -> None:
    t = translate_overrides(
        [f"{AR}.actor.ulysses_sequence_parallel_size=2", f"{AR}.actor.ppo_micro_batch_size=6"]
    )
    (u,) = [u for u in t.unmapped if u.key == f"{AR}.actor.ppo_micro_batch_size"]
    assert "dp 4 = 8 GPUs / (sp 2 x tp 1)" in u.reason
    critic = translate_overrides(["critic.ulysses_sequence_parallel_size=4", "critic.ppo_micro_batch_size=6"])
    assert critic.quartet_values["critic.micro_batch_size_per_device"] == 3  # dp 2: the critic's own sp


# Every rule with a `how`: an override whose value the conversion keeps, and one it changes (None: there is
# none). A kept value must print nothing (`trainer.test_freq=5 -> trainer.test_freq=5 (-1 (never) -> 0)`
# was the defect); a changed one, or a rule whose note is about the key, prints its note.
NOTE_CASES: dict[str, tuple[str | None, str | None]] = {
    "data.train_files": ("[a.parquet]", "a.parquet"),
    "data.val_files": ("[a.parquet]", "a.parquet"),
    "data.filter_overlong_prompts": (None, "True"),
    "data.truncation": ("error", None),  # left -> truncate is skipped when filtering, tested below
    f"{AR}.model.target_modules": ("[q_proj,v_proj]", None),
    f"{AR}.actor.optim.lr_warmup_steps": ("10", "-1"),
    f"{AR}.actor.optim.min_lr_ratio": ("0.1", "null"),
    f"{AR}.actor.ppo_micro_batch_size": (None, "128"),
    f"{AR}.actor.policy_loss.loss_mode": ("gspo", "vanilla"),
    f"{AR}.rollout.name": ("vllm", "hf"),
    f"{AR}.rollout.mode": (None, "sync"),
    f"{AR}.rollout.top_k": ("50", "-1"),
    f"{AR}.rollout.enforce_eager": (None, "True"),
    f"{AR}.rollout.log_prob_micro_batch_size": (None, "64"),
    f"{AR}.rollout.val_kwargs.top_k": ("50", "-1"),
    f"{AR}.rollout.val_kwargs.do_sample": (None, "False"),
    f"{AR}.rollout.agent.default_agent_loop": ("tool_agent", "single_turn_agent"),
    f"{AR}.rollout.multi_turn.format": ("hermes", None),
    f"{AR}.ref.log_prob_micro_batch_size": (None, "64"),
    "critic.optim.lr_warmup_steps": ("10", "-1"),
    "critic.ppo_micro_batch_size": (None, "64"),
    "critic.forward_micro_batch_size": (None, "64"),
    "reward_model.micro_batch_size": (None, "64"),
    "custom_reward_function.path": (None, "r.py"),
    "trainer.total_training_steps": ("100", "null"),
    "trainer.logger": (None, "[console]"),  # jsonl is always added
    "trainer.save_freq": ("5", "-1"),
    "trainer.test_freq": ("5", "-1"),
    "trainer.max_actor_ckpt_to_keep": ("3", "null"),
    "trainer.resume_mode": ("auto", "disable"),
    "trainer.device": ("cpu", "cuda"),
    "ray_init.num_cpus": ("16", "null"),
}
KEY_NOTES = {f"{AR}.actor.clip_ratio", "trainer.n_gpus_per_node"}  # notes about the key: always printed


def test_every_converting_rule_has_a_note_case() -> None:
    with_how = {key for key, rule in RULES.items() if rule.how}
    assert with_how == set(NOTE_CASES) | KEY_NOTES
    assert {key for key in with_how if not RULES[key].value_note} == KEY_NOTES


def _applied(key: str, raw: str) -> list[bool]:
    t = translate_overrides([f"{key}={raw}"], verl_defaults=False)
    return [c.applied for c in t.conversions if c.verl_key == key and c.how]


@pytest.mark.parametrize("key", sorted(NOTE_CASES))
def test_a_value_mapping_note_applies_only_when_it_changed_the_value(key: str) -> None:
    kept, changed = NOTE_CASES[key]
    if kept is not None:
        assert _applied(key, kept) and not any(_applied(key, kept)), key
    if changed is not None:
        assert _applied(key, changed) and all(_applied(key, changed)), key


def test_a_ratio_is_not_rounded_to_an_integer() -> None:
    t = translate_overrides([f"{AR}.actor.optim.min_lr_ratio=0.1", f"{AR}.model.path=/m"])
    assert t.quartet_values["actor.optim.min_lr_ratio"] == 0.1
    assert t.build().actor.optim.min_lr_ratio == 0.1
