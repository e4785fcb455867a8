"""`from_verl`: verl's documented example command lines translate into quartet configs that validate.

The override lists below are verl's own, as its repository ships them (shell variables left as written:
quartet's loader does not open model or data paths, so the configs validate without the files). Expected
values are written by hand from verl's documented meaning of each key, not captured from the translator.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from quartet.config import QuartetConfig, iter_field_docs
from quartet.config.from_verl import FromVerlError, translate, translate_overrides, translate_tree
from quartet.config.verl_keys import RULES
from quartet.config.verl_unmapped import UNMAPPED

# verl examples/grpo_trainer/run_qwen2-7b.sh (volcengine/verl @ 3f388066192c), GRPO on GSM8K.
GRPO_GSM8K = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=$HOME/data/gsm8k/train.parquet",
    "data.val_files=$HOME/data/gsm8k/test.parquet",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=['console','wandb']",
    "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2_7b_function_rm'",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]

# verl examples/ppo_trainer/run_deepseek7b_llm.sh (volcengine/verl @ 2ddb4939694), PPO with a critic.
PPO_DEEPSEEK = [
    "algorithm.adv_estimator=gae",
    "data.train_files=$HOME/data/gsm8k/train.parquet",
    "data.val_files=$HOME/data/gsm8k/test.parquet",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=512",
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "critic.optim.lr=1e-5",
    "critic.model.use_remove_padding=False",
    "critic.model.path=deepseek-ai/deepseek-llm-7b-chat",
    "critic.model.enable_gradient_checkpointing=True",
    "critic.ppo_micro_batch_size_per_gpu=32",
    "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=['console']",
    "trainer.project_name='verl_example_gsm8k'",
    "trainer.experiment_name='deepseek_llm_7b_function_rm'",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.total_training_steps=2",
    "trainer.use_legacy_worker_impl=False",
    "trainer.total_epochs=15",
]

# verl docs/start/quickstart.rst (volcengine/verl @ 487830669aea), "PPO training on GSM8K", one GPU. It sets
# no adv_estimator and no rollout.n: verl's defaults (gae, 1) must be what the translation uses.
PPO_QUICKSTART = [
    "data.train_files=$HOME/data/gsm8k/train.parquet",
    "data.val_files=$HOME/data/gsm8k/test.parquet",
    "data.train_batch_size=256",
    "data.max_prompt_length=512",
    "data.max_response_length=256",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.optim.lr=1e-5",
    "critic.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.logger=['console']",
    "trainer.val_before_train=False",
    "trainer.default_hdfs_dir=null",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.save_freq=10",
    "trainer.test_freq=10",
    "trainer.total_epochs=15",
]


MODEL = "actor_rollout_ref.model.path"


def test_a_missing_model_path_is_named() -> None:
    t = translate_overrides(["actor_rollout_ref.rollout.n=2"])
    (u,) = [u for u in t.unmapped if u.key == MODEL]
    assert "tiny" in u.reason


def _get(cfg: QuartetConfig, dotted: str) -> object:
    node: object = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _check_fields(cfg: QuartetConfig, expected: dict[str, object]) -> None:
    wrong = {k: (_get(cfg, k), v) for k, v in expected.items() if _get(cfg, k) != v}
    assert not wrong, f"fields (got, expected): {wrong}"


def test_grpo_gsm8k_example_translates_and_validates() -> None:
    t = translate_overrides(GRPO_GSM8K)
    cfg = t.build()
    _check_fields(
        cfg,
        {
            "algorithm.adv_estimator": "grpo",
            "rollout.n": 5,
            "data.train_files": ("$HOME/data/gsm8k/train.parquet",),
            "data.val_files": ("$HOME/data/gsm8k/test.parquet",),
            "data.train_batch_size": 1024,  # prompts in both
            "data.max_prompt_length": 512,
            "data.max_response_length": 1024,
            "data.overlong_prompt": "filter",
            "model.path": "Qwen/Qwen2-7B-Instruct",
            "model.gradient_checkpointing": True,
            "actor.optim.lr": 1e-6,
            "actor.mini_batch_size": 256,  # prompts in both
            "actor.micro_batch_size_per_device": 40,  # responses per GPU in both
            "actor.use_kl_loss": True,
            "actor.kl_loss_coef": 0.001,
            "actor.kl_loss_type": "low_var_kl",
            "actor.entropy_coeff": 0.0,
            "actor.param_offload": False,
            "actor.optimizer_offload": False,
            "actor.dual_clip_c": 3.0,  # verl's clip_ratio_c default, on in verl's loss
            "actor.logprobs.micro_batch_size_per_device": 40,
            "reference.logprobs.micro_batch_size_per_device": 40,
            "reference.param_offload": True,
            "rollout.engine": "vllm",
            "rollout.gpu_memory_utilization": 0.6,
            "rollout.tensor_parallel_size": 2,
            "algorithm.use_kl_in_reward": False,
            "trainer.critic_warmup": 0,
            "trainer.project_name": "verl_grpo_example_gsm8k",
            "trainer.experiment_name": "qwen2_7b_function_rm",
            "trainer.save_freq": 20,
            "trainer.test_freq": 5,
            "trainer.total_epochs": 15,
            "cluster.nodes": 1,
            "cluster.bundles_per_node": 8,
            "cluster.device": "gpu",
        },
    )
    assert [str(x) for x in cfg.trainer.loggers] == ["console", "wandb", "jsonl"]
    assert cfg.cluster.world_size == 8
    # 256 prompts x 5 responses over 8 GPUs = 160 per GPU, 4 micro-batches of 40: verl's own arithmetic.
    assert 256 * 5 // 8 // cfg.actor.micro_batch_size_per_device == 4
    assert {u.key for u in t.unmapped} == {"data.truncation"}
    assert cfg.model.remove_padding  # verl's use_remove_padding=True: packed micro-batches
    assert not [k for k in t.quartet_values if k.startswith("critic.")]  # GRPO trains no critic
    assert all(u.reason for u in t.unmapped)


def test_ppo_example_translates_with_critic_and_validates() -> None:
    t = translate_overrides(PPO_DEEPSEEK)
    cfg = t.build()
    assert cfg.algorithm.needs_critic
    _check_fields(
        cfg,
        {
            "algorithm.adv_estimator": "gae",
            "rollout.n": 1,  # verl's default: PPO samples one response per prompt
            "actor.micro_batch_size_per_device": 16,
            "actor.logprobs.micro_batch_size_per_device": 32,
            "actor.use_kl_loss": False,
            "critic.optim.lr": 1e-5,
            "critic.model_path": "deepseek-ai/deepseek-llm-7b-chat",
            "critic.micro_batch_size_per_device": 32,
            "critic.mini_batch_size": 256,  # verl's critic mini-batch defaults to the actor's
            "rollout.tensor_parallel_size": 4,
            "rollout.gpu_memory_utilization": 0.4,
            "trainer.total_steps": 2,
            "trainer.total_epochs": 15,
            "trainer.test_freq": 0,  # verl's default -1: never
        },
    )
    assert [str(x) for x in cfg.trainer.loggers] == ["console", "jsonl"]
    assert {u.key for u in t.unmapped} == {
        "data.truncation",
        "critic.model.use_remove_padding",
        "critic.model.enable_gradient_checkpointing",
        "trainer.use_legacy_worker_impl",
    }


def test_quickstart_uses_verl_defaults_for_unset_keys() -> None:
    t = translate_overrides(PPO_QUICKSTART)
    cfg = t.build()
    _check_fields(
        cfg,
        {
            "algorithm.adv_estimator": "gae",
            "rollout.n": 1,
            "cluster.bundles_per_node": 1,
            "actor.mini_batch_size": 64,
            "critic.mini_batch_size": 64,
            "actor.micro_batch_size_per_device": 4,
            "critic.micro_batch_size_per_device": 4,
            "reference.logprobs.micro_batch_size_per_device": 4,
            "algorithm.kl_ctrl.coef": 0.001,
            "trainer.val_before_train": False,
            "trainer.save_freq": 10,
            "trainer.test_freq": 10,
        },
    )
    assert [c.verl_key for c in t.sources("algorithm.adv_estimator")] == ["algorithm.adv_estimator"]
    assert t.sources("algorithm.adv_estimator")[0].from_default
    assert {u.key for u in t.unmapped} == {"trainer.default_hdfs_dir"}


def test_without_verl_defaults_unset_keys_keep_quartet_defaults() -> None:
    t = translate_overrides(["actor_rollout_ref.rollout.n=2"], verl_defaults=False)
    assert {u.key for u in t.unmapped} == {MODEL}
    assert t.quartet_values == {"rollout.n": 2, "cluster.device": "gpu"}
    assert t.build().algorithm.adv_estimator == QuartetConfig().algorithm.adv_estimator


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("trainer.save_freq=-1", "trainer.save_freq", 0),
        ("trainer.test_freq=-1", "trainer.test_freq", 0),
        ("actor_rollout_ref.rollout.top_k=-1", "rollout.top_k", 0),
        ("actor_rollout_ref.rollout.enforce_eager=True", "rollout.cuda_graphs", False),
        ("actor_rollout_ref.rollout.enforce_eager=false", "rollout.cuda_graphs", True),
        ("actor_rollout_ref.rollout.name=hf", "rollout.engine", "torch"),
        ("trainer.logger=console", "trainer.loggers", ["console", "jsonl"]),
        ("trainer.resume_mode=disable", "trainer.resume", "off"),
        ("trainer.total_training_steps=null", "trainer.total_steps", 0),
        ("actor_rollout_ref.actor.ppo_micro_batch_size=128", "actor.micro_batch_size_per_device", 16),
        ("critic.ppo_micro_batch_size=64", "critic.micro_batch_size_per_device", 8),
        ("actor_rollout_ref.rollout.val_kwargs.do_sample=False", "rollout.val.temperature", 0.0),
        ("data.train_files=[a.parquet,b.parquet]", "data.train_files", ["a.parquet", "b.parquet"]),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", "actor.policy_loss", "ppo"),
    ],
)
def test_converted_values(override: str, key: str, value: object) -> None:
    assert translate_overrides([override]).quartet_values[key] == value


def test_dynamic_batching_follows_the_actor_as_in_verl() -> None:
    t = translate_overrides(
        [
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
            "critic.ppo_micro_batch_size_per_gpu=2",
        ]
    )
    for key in ("actor.logprobs", "reference.logprobs"):
        assert t.quartet_values[f"{key}.use_dynamic_batch"] is True
        assert t.quartet_values[f"{key}.max_tokens_per_micro_batch"] == 24000
    assert t.quartet_values["critic.use_dynamic_batch"] is True
    assert t.quartet_values["critic.values.micro_batch_size_per_device"] == 2
    # an explicit value wins over the followed one
    t = translate_overrides(
        [
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False",
        ]
    )
    assert t.quartet_values["actor.logprobs.use_dynamic_batch"] is False


def test_clip_ratio_sets_both_sides_and_reward_function_joins_path_and_name() -> None:
    t = translate_overrides(
        [
            "actor_rollout_ref.actor.clip_ratio=0.25",
            "custom_reward_function.path=rw.py",
            "custom_reward_function.name=score",
        ]
    )
    assert t.quartet_values["actor.clip_ratio_low"] == t.quartet_values["actor.clip_ratio_high"] == 0.25
    assert t.quartet_values["reward.function"] == "rw.py:score"


def test_clip_ratio_yields_to_explicit_sides() -> None:
    t = translate_overrides(
        ["actor_rollout_ref.actor.clip_ratio=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.28"]
    )
    assert (t.quartet_values["actor.clip_ratio_low"], t.quartet_values["actor.clip_ratio_high"]) == (
        0.2,
        0.28,
    )
    assert not [u for u in t.unmapped if u.key.startswith("actor_rollout_ref.actor.clip")]


def test_subtree_keys_get_the_subtree_reason_and_typos_inside_still_a_suggestion() -> None:
    t = translate_overrides(
        [
            "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=0",
            "actor_rollout_ref.actor.fsdp_config.param_ofload=True",
            "actor_rollout_ref.rollout.multi_turn.format=chatml",
        ]
    )
    reasons = {u.key: u.reason for u in t.unmapped}
    assert "FSDP detail" in reasons["actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params"]
    assert (
        "did you mean 'actor_rollout_ref.actor.fsdp_config.param_offload'"
        in reasons["actor_rollout_ref.actor.fsdp_config.param_ofload"]
    )
    assert "hermes" in reasons["actor_rollout_ref.rollout.multi_turn.format"]


def test_global_micro_batch_that_does_not_split_over_gpus_is_named() -> None:
    t = translate_overrides(["actor_rollout_ref.actor.ppo_micro_batch_size=100"])  # 8 GPUs by default
    (u,) = [u for u in t.unmapped if u.key == "actor_rollout_ref.actor.ppo_micro_batch_size"]
    assert "8 GPUs" in u.reason and "actor.micro_batch_size_per_device" not in t.quartet_values


def test_typo_gets_a_suggestion_and_unknown_keys_a_reason() -> None:
    t = translate_overrides(
        [
            "actor_rollout_ref.actor.ppo_mini_batchsize=256",
            "foo.bar=1",
            "+actor_rollout_ref.actor.my_recipe_knob=3",
            "actor_rollout_ref.rollout.name=sglang",
            f"{MODEL}=/models/m",
            "hydra.run.dir=/tmp/x",
        ]
    )
    reasons = {u.key: u.reason for u in t.unmapped}
    assert (
        "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'"
        in reasons["actor_rollout_ref.actor.ppo_mini_batchsize"]
    )
    assert "no quartet equivalent" in reasons["foo.bar"]
    assert "'+'" in reasons["actor_rollout_ref.actor.my_recipe_knob"]
    assert "sglang" in reasons["actor_rollout_ref.rollout.name"]
    assert "Hydra" in reasons["hydra.run.dir"]


def test_values_that_fail_validation_name_their_verl_keys() -> None:
    with pytest.raises(FromVerlError) as info:
        translate_overrides([*GRPO_GSM8K, "data.train_batch_size=1000"]).build()
    text = str(info.value)
    assert "actor.mini_batch_size: 256 prompts does not divide data.train_batch_size=1000" in text
    assert "translated from: actor_rollout_ref.actor.ppo_mini_batch_size=256" in text


def test_a_bad_value_type_names_its_verl_key() -> None:
    with pytest.raises(FromVerlError) as info:
        translate_overrides([*GRPO_GSM8K, "actor_rollout_ref.rollout.n=five"]).build()
    assert "rollout.n: expected an integer" in str(info.value)
    assert "translated from: actor_rollout_ref.rollout.n=five" in str(info.value)


def test_conflicting_spellings_of_one_field_are_reported() -> None:
    t = translate_overrides(
        [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size=64",  # 8 per GPU: disagrees
        ]
    )
    assert t.quartet_values["actor.micro_batch_size_per_device"] == 4
    (u,) = [u for u in t.unmapped if u.key == "actor_rollout_ref.actor.ppo_micro_batch_size"]
    assert "conflicts with actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4" in u.reason


def test_yaml_tree_resolves_references_and_applies_overrides_after_it() -> None:
    tree = {
        "defaults": ["ppo_trainer"],
        "data": {"train_batch_size": 64, "max_response_length": 128},
        "actor_rollout_ref": {
            "actor": {"ppo_mini_batch_size": 16, "ppo_micro_batch_size_per_gpu": 2},
            "rollout": {"n": 4, "response_length": "${oc.select:data.max_response_length,512}"},
        },
        "critic": {"ppo_mini_batch_size": "${actor_rollout_ref.actor.ppo_mini_batch_size}"},
        "algorithm": {"adv_estimator": "grpo"},
    }
    tree["actor_rollout_ref"]["model"] = {"path": "/models/m"}  # type: ignore[index]
    t = translate_tree(tree, overrides=["actor_rollout_ref.rollout.n=8"])
    assert t.quartet_values["critic.mini_batch_size"] == 16
    assert t.quartet_values["rollout.n"] == 8
    (u,) = [u for u in t.unmapped if u.key == "actor_rollout_ref.rollout.response_length"]
    assert "interpolation" in u.reason
    assert t.build().data.train_batch_size == 64


def test_null_values_of_a_verl_yaml_keep_quartet_defaults() -> None:
    tree = {
        "data": {"val_batch_size": None, "train_batch_size": 64},
        "actor_rollout_ref": {
            "model": {"path": "/models/m"},
            "actor": {
                "ppo_mini_batch_size": 16,
                "ppo_micro_batch_size": None,
                "optim": {"min_lr_ratio": None},
            },
            "rollout": {"n": 2, "log_prob_micro_batch_size_per_gpu": None},
        },
        "trainer": {"total_training_steps": None, "n_gpus_per_node": 1},
    }
    t = translate_tree(tree)
    reasons = {u.key: u.reason for u in t.unmapped}
    assert "quartet's default for data.val_batch_size" in reasons["data.val_batch_size"]
    assert "null" in reasons["actor_rollout_ref.actor.ppo_micro_batch_size"]
    assert "null" in reasons["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"]
    assert t.quartet_values["trainer.total_steps"] == 0 and t.quartet_values["actor.optim.min_lr_ratio"] == 0
    cfg = t.build()
    assert cfg.data.val_batch_size == QuartetConfig().data.val_batch_size


def test_every_rule_targets_a_real_quartet_field() -> None:
    fields = {path for path, _ in iter_field_docs(QuartetConfig)}
    targets = {t for rule in RULES.values() for t in (rule.target, *rule.also)}
    assert targets - fields == set()
    assert not set(RULES) & set(UNMAPPED)


def test_docs_table_names_every_verl_key() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "from_verl.md").read_text()
    missing = [k for k in [*RULES, *UNMAPPED] if f"`{k}`" not in doc]
    assert not missing, f"docs/from_verl.md does not mention {missing}"


def test_translation_round_trips_through_plain_mapping() -> None:
    values = {"actor_rollout_ref.rollout.n": 6, "algorithm.adv_estimator": "rloo", MODEL: "/models/m"}
    cfg = translate(values).build()
    assert (cfg.rollout.n, str(cfg.algorithm.adv_estimator)) == (6, "rloo")
    assert dataclasses.is_dataclass(cfg)


def test_agent_loop_names_translate() -> None:
    t = translate_overrides(
        [
            "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
            "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=512",
        ]
    )
    assert t.quartet_values["rollout.multi_turn.default_agent"] == "single_turn"
    assert t.quartet_values["rollout.multi_turn.max_tool_response_length"] == 512
    t = translate_overrides(["actor_rollout_ref.rollout.agent.default_agent_loop=my_loop"])
    (u,) = [u for u in t.unmapped if u.key.endswith("default_agent_loop")]
    assert "my_loop" in u.reason


@pytest.mark.parametrize(("verl", "quartet"), [("sync", "batch"), ("async", "server")])
def test_rollout_mode_maps_to_the_rollout_interface(verl: str, quartet: str) -> None:
    t = translate_overrides([f"actor_rollout_ref.rollout.mode={verl}", f"{MODEL}=/models/m"])
    assert t.quartet_values["rollout.interface"] == quartet
    assert "rollout.mode" not in t.quartet_values
    assert t.build().rollout.interface.value == quartet


def test_megatron_tensor_parallel_size_maps_to_the_engine_tp() -> None:
    key = "actor_rollout_ref.{}.megatron.tensor_model_parallel_size"
    t = translate({key.format("actor"): 2, "trainer.n_gpus_per_node": 4}, verl_defaults=False)
    assert t.quartet_values["model.tensor_parallel_size"] == 2
    ref_only = translate({key.format("ref"): 2, "trainer.n_gpus_per_node": 4}, verl_defaults=False)
    assert ref_only.quartet_values["model.tensor_parallel_size"] == 2
    other = translate(
        {"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 2}, verl_defaults=False
    )
    assert "no Megatron backend" in other.unmapped[0].reason
